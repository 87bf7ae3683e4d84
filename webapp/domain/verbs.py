"""The lab agent's commands by name: the ``verb`` of a row in the commands queue.

Whoever asks the agent for work (an operation, a class's lab, the CLI's housekeeping, the agent's
own chaos runs and recovery, a guided scenario) names the command with one of these, and the
agent's handler table is keyed by them, so a grep for a constant finds every caller and the
handler.
"""
from __future__ import annotations

LAB_ENSURE = "lab.ensure"
LAB_RESET = "lab.reset"
LAB_DROP = "lab.drop"
TOPIC_RETENTION = "topic.retention"
LANE_KAFKA_PRINCIPAL = "lane.kafka_principal"

PUBLISH = "publish"
PRODUCE_RAW = "produce.raw"

CONSUMER_START = "consumer.start"
CONSUMER_STOP = "consumer.stop"
CONSUMER_KILL = "consumer.kill"
CONSUMER_FREEZE = "consumer.freeze"
CONSUMER_THAW = "consumer.thaw"
CONSUMER_RESTART = "consumer.restart"

GROUP_RESET = "group.reset"
GROUP_RECOVER = "group.recover"

CHAOS_START = "chaos.start"
LOAD_START = "load.start"
DEDUP_WARMUP = "dedup.warmup"
EXPLORATION_START = "exploration.start"
# Run by the agent started with the scenarios' handler (``python -m webapp.agent``): a guided
# scenario's step, carried out on the agent's side.
SCENARIO_STEP = "scenario.step"
