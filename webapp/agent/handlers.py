"""Verb → handler: what the agent does for each command.

Each handler takes the agent (its connections, Kafka clients and process pool), the lab and the
command's typed arguments (domain/commands.py, parsed by the worker before the handler runs), and
returns the command's result. ``CommandRejected`` (arguments the agent cannot act on, the message
names the field) and ``LookupError`` (no such consumer or group) fail the command with that reason.
"""
from __future__ import annotations

from typing import Callable

from confluent_kafka import KafkaException

from .. import strategies
from ..domain import commands, verbs
from ..domain.group_health import SESSION_TIMEOUT_MS
from ..domain.lab import Lab
from ..domain.vocabulary import (
    DEFAULT_GROUP,
    DEFAULT_STRATEGY,
    OUTSIDE_STRATEGY,
    SCRAM_LEARNERS,
)
from ..domain.waits import WaitTimeout, wait_until
from ..kafka import producer
from ..kafka.admin import (
    OffsetReset,
    alter_offsets,
    committed_offsets,
    create_lane_principal,
    group_state,
    set_topic_configs,
    target_offsets,
)
from ..kafka.config import producer_config
from ..settings import load_config
from ..store import command_channel, consumer_groups, group_health, outside
from ..store import consumers as consumer_rows
from ..store.schema import quoted
from . import chaos_runner, setup
from .context import AgentContext
from .explorations import RUNS as EXPLORATION_RUNS
from .explorations import start_exploration
from .load import RUNS as LOAD_RUNS
from .load import start_load
from .periodic import snapshot_offsets
from .processes import STOP_TIMEOUT, NotRunning
from .prune import delete_groups, drop
from .warmup import RUNS as WARMUP_RUNS
from .warmup import start_warmup

DEFAULT_PARTITIONS = 3
GROUP_EMPTY_TIMEOUT = 20.0


class CommandRejected(ValueError):
    """A command with bad arguments; the message names the field."""


Handler = Callable[[AgentContext, Lab, commands.Command], dict]


def _own_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> consumer_rows.Row:
    consumer_id = command.consumer_id
    with agent.engine.connect() as conn:
        row = consumer_rows.get(conn, consumer_id)
    if row is None or row.lab != lab.name:
        raise LookupError(f"no consumer {consumer_id} in lab {lab.name}")
    if row.agent_id != agent.id:
        raise CommandRejected(f"consumer {consumer_id} belongs to agent {row.agent_id}, not {agent.id}")
    return row


def _running(agent: AgentContext, consumer_id: int):
    try:
        return agent.pool.running(consumer_id)
    except NotRunning as error:
        raise CommandRejected(str(error)) from None


def _set_state(agent: AgentContext, consumer_id: int, state: str) -> None:
    with agent.engine.begin() as conn:
        consumer_rows.set_state(conn, consumer_id, state)


# --- the lab ------------------------------------------------------------------------------

def ensure_lab(agent: AgentContext, lab: Lab, command: commands.LabSetup) -> dict:
    """Create the lab's schema, seed accounts, topics and default group if missing."""
    return setup.ensure(agent.engine, agent.admin, lab, command.partitions or DEFAULT_PARTITIONS)


def quiesce(agent: AgentContext, lab: Lab) -> None:
    """Stop what writes into a lab's topic and tables before they are deleted: its consumers (on
    whichever agent runs them), a running load (it would produce into the topic being deleted) and a
    running dedup warm-up (it would insert into the tables being deleted); close the agent's
    producers of the lab. A running exploration goes first: it would start consumers again."""
    EXPLORATION_RUNS.stop(agent.engine, lab, "the lab was reset or deleted while it ran")
    with agent.engine.connect() as conn:
        rows = consumer_rows.live(conn, lab.name)
    for row in rows:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_STOP)
    for row in rows:
        agent.pool.forget(row.id)
    LOAD_RUNS.stop(lab)
    WARMUP_RUNS.stop(lab)
    agent.publisher.forget(lab)


def reset_lab(agent: AgentContext, lab: Lab, command: commands.LabSetup) -> dict:
    """Stop the lab's consumers, delete its topics and schemas, start it fresh."""
    partitions = command.partitions or DEFAULT_PARTITIONS
    _forget_outside_offsets(agent, lab)
    quiesce(agent, lab)
    # librdkafka crashes a consumer whose assigned topic is deleted (docs/concepts/broker.md): the log reader is
    # held off Kafka (its consumer closed) around the topics' re-creation, rather than left to crash.
    with agent.log_mirror.held():
        return setup.recreate(agent.engine, agent.admin, lab, partitions)


def set_topic_retention(agent: AgentContext, lab: Lab, command: commands.TopicRetention) -> dict:
    """The lab's topic's retention.ms and/or segment.ms, as the broker then has them."""
    configs = {name: str(value) for name, value in (("retention.ms", command.retention_ms),
                                                     ("segment.ms", command.segment_ms)) if value is not None}
    try:
        set_topic_configs(agent.admin, lab.topic, configs)
    except KafkaException as error:
        raise CommandRejected(f"the broker refused {', '.join(configs)} on {lab.topic}: {error}") from None
    agent.say(lab, "lab", f"{lab.topic}: " + ", ".join(f"{name}={value}" for name, value in configs.items())
              + " (the broker deletes a segment once its newest record is older than retention.ms)", **configs)
    return {"topic": lab.topic, "configs": configs}


def _forget_outside_offsets(agent: AgentContext, lab: Lab) -> None:
    """Before a reset re-creates the topic empty: delete the groups of the lab's outside consumers,
    whose committed offsets would otherwise point past the new topic's records. The lab
    cannot stop code it does not run: a group that still has members refuses the reset."""
    with agent.in_lab(lab):
        groups = consumer_groups.with_strategy(agent.conn.execute, lab.schema, OUTSIDE_STRATEGY)
    _, failed = delete_groups(agent.admin, groups)
    busy = [group for group, why in failed.items() if "NOT_EMPTY" in why.upper()]
    if busy:
        raise CommandRejected(f"partitions: your consumer is still a member of group {', '.join(busy)}: stop it, "
                              "then reset (the topic is re-created empty, and its committed offsets with it)")


def drop_lab(agent: AgentContext, lab: Lab, command: commands.NoArguments) -> dict:
    """The agent's ``lab.drop``: stop the lab's consumers and load, hold the log reader off, drop it."""
    quiesce(agent, lab)
    # librdkafka crashes a reader whose assigned topic is deleted (docs/concepts/broker.md): hold it off meanwhile.
    with agent.log_mirror.held():
        return drop(agent.engine, agent.admin, lab)


def grant_lane_principal(agent: AgentContext, lab: Lab, command: commands.LanePrincipal) -> dict:
    """The agent's ``lane.kafka_principal``: on Apache Kafka's SCRAM listener for learners, the lane's
    SCRAM user (its role's name, its Kafka password) and ACLs: its lab's topic, its group."""
    config = load_config()
    if config.get("KAFKA_LEARNER_SASL_MECHANISM") != SCRAM_LEARNERS:
        return {"created": False}  # the embedded broker's gateway reads the lane's principal itself
    lane = command.lane
    with agent.engine.connect() as conn:
        issued = outside.credentials_of(conn, config["SECRET_KEY"], lab.lane_role(lane))
    if issued is None:
        raise CommandRejected(f"lane: lab {lab.name} has no lane {lane} for your consumer, or its password was kept "
                              "under another SECRET_KEY: create it again")
    create_lane_principal(agent.admin, issued.role, issued.kafka_password, lab.topic, lab.group_id(lane))
    return {"created": True, "username": issued.role}


def publish(agent: AgentContext, lab: Lab, command: commands.Publish) -> dict:
    with agent.in_lab(lab):
        try:
            result = producer.publish(agent.conn, agent.publisher, lab, command)
        except producer.PublishError as error:
            raise CommandRejected(str(error)) from None
    return result  # the requester waits for the log reader's mirror (ops/publishing.py), not the agent


def produce_raw(agent: AgentContext, lab: Lab, command: commands.ProduceRaw) -> dict:
    """One record exactly as typed, to the lab's topic, like any other Kafka client would write it."""
    config = producer_config(agent.producer_bootstrap_servers, command.idempotent, client_id=lab.producer_client_id)
    try:
        record = producer.produce_raw(config, lab.topic, command.key, command.value,
                                      headers=command.headers, partition=command.partition,
                                      aborted_transaction=command.transaction == "abort")
    except producer.PublishError as error:
        raise CommandRejected(str(error)) from None
    aborted = " in a Kafka transaction, then aborted" if record.get("aborted") else ""
    agent.say(lab, "published", f"raw record to P{record['partition']}@{record['offset']}{aborted} "
              f"(key {command.key!r}, {len(command.value or '')} characters)", records=[record])
    return {"topic": lab.topic, **record}


# --- consumers ------------------------------------------------------------------------------

def _ensure_group(agent: AgentContext, lab: Lab, group: str, strategy: str | None) -> str:
    """The group's id, created with ``strategy`` if new. An existing group keeps its strategy:
    switching it is its own, visible action (every member changes behaviour)."""
    group_id = lab.group_id(group)
    with agent.in_lab(lab):
        current = consumer_groups.strategy_of(agent.conn.execute, lab.schema, group_id)
        if current is None:
            consumer_groups.create(agent.conn.execute, lab.schema, group_id, strategy or DEFAULT_STRATEGY, lab.schema)
        elif strategy is not None and strategy != current:
            raise CommandRejected(f"strategy: group {group_id} uses {current}; switch the group's strategy "
                                  f"first, or start the consumer in another group")
    return group_id


def start_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerStart) -> dict:
    group = command.group or DEFAULT_GROUP
    strategy = command.strategy
    if strategy is not None:
        try:
            strategies.get(strategy)
        except strategies.UnknownStrategy as error:
            raise CommandRejected(str(error)) from None
    group_id = _ensure_group(agent, lab, group, strategy)
    with agent.in_lab(lab):
        current = consumer_groups.strategy_of(agent.conn.execute, lab.schema, group_id)
    if current == OUTSIDE_STRATEGY:
        raise CommandRejected(f"group: {group_id} is your consumer's group: your own code consumes in it, "
                              "not one of the lab's consumers")
    point, action = command.point, command.action
    with agent.engine.begin() as conn:
        name = command.name or consumer_rows.next_name(conn, lab.name)
        consumer_id = consumer_rows.create(conn, lab.name, name, group_id, agent.id)
        if point is not None:  # before the process exists: the first record it is handed meets the fault
            consumer_rows.arm(conn, consumer_id, point=point, action=action, always=False)
    pid = agent.spawn(lab, consumer_id, name)
    agent.say(lab, "started", f"started consumer {name} in group {group_id}", consumer=name, group=group_id)
    if point is not None:
        agent.say(lab, "fault", f"{name}: armed {action} at {point} (once)")
    return {"consumer_id": consumer_id, "name": name, "group_id": group_id, "pid": pid}


def kill_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> dict:
    row = _own_consumer(agent, lab, command)
    _running(agent, row.id)
    agent.pool.kill(row.id)  # SIGKILL: no commit, no group leave, even when frozen
    agent.reap_children()
    return {"consumer_id": row.id, "name": row.name, "state": "killed"}


def _pause_or_resume(agent: AgentContext, lab: Lab, command: commands.ConsumerRef, frozen: bool) -> dict:
    row = _own_consumer(agent, lab, command)
    _running(agent, row.id)
    if frozen:
        agent.pool.freeze(row.id)
        state, kind, summary = "frozen", "frozen", f"{row.name} frozen (SIGSTOP): no heartbeats, no progress"
    else:
        agent.pool.thaw(row.id)
        state, kind, summary = "running", "thawed", f"{row.name} thawed (SIGCONT): it carries on where it stopped"
    _set_state(agent, row.id, state)
    agent.say(lab, kind, summary, consumer=row.name)
    return {"consumer_id": row.id, "name": row.name, "state": state}


def freeze_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> dict:
    return _pause_or_resume(agent, lab, command, frozen=True)


def thaw_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> dict:
    return _pause_or_resume(agent, lab, command, frozen=False)


def stop_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> dict:
    row = _own_consumer(agent, lab, command)
    agent.pool.stop(row.id)
    agent.reap_children()
    return {"consumer_id": row.id, "name": row.name, "state": "stopped"}


def restart_consumer(agent: AgentContext, lab: Lab, command: commands.ConsumerRef) -> dict:
    row = _own_consumer(agent, lab, command)
    agent.pool.stop(row.id)
    agent.reap_children()
    pid = agent.spawn(lab, row.id, row.name)
    agent.say(lab, "started", f"restarted consumer {row.name}", consumer=row.name, group=row.group_id)
    return {"consumer_id": row.id, "name": row.name, "pid": pid}


def on_own_or_remote(agent: AgentContext, lab: Lab, row: consumer_rows.Row, verb: str) -> None:
    """Carry out a consumer command here, or through its owning agent and wait. A consumer of an
    agent that no longer beats is skipped: nothing can act on it (the reaper marks it gone)."""
    command = commands.ConsumerRef(consumer_id=row.id)
    if row.agent_id == agent.id:
        HANDLERS[verb](agent, lab, command)
        return
    if row.agent_id not in command_channel.live_agents(agent.engine):
        return
    command_id = command_channel.enqueue(agent.engine, lab.name, verb, commands.encode(verb, command), row.agent_id)
    command_channel.wait_for(agent.engine, command_id, timeout=STOP_TIMEOUT + 10)


# --- groups ---------------------------------------------------------------------------------

def _live_members(agent: AgentContext, lab: Lab, group_id: str) -> list[consumer_rows.Row]:
    """The group's live consumers; LookupError when the lab has no such group."""
    if not consumer_groups.exists(agent.conn.execute, lab.schema, group_id):
        raise LookupError(f"no group {group_id} in lab {lab.name}")
    with agent.engine.connect() as conn:
        return consumer_rows.live(conn, lab.name, group_id)


def _once_the_group_is_empty(group_id: str, attempt: Callable[[], str | None]) -> None:
    """Run ``attempt`` (None when it succeeded, else the broker's error) until it succeeds: Kafka
    changes a group's offsets only while the group is empty, and a killed member stays in it until
    its session times out. CommandRejected with the last error after GROUP_EMPTY_TIMEOUT."""
    last_error: list[str] = []

    def succeeded() -> bool:
        error = attempt()
        last_error[:] = [error] if error is not None else []
        return error is None
    try:
        wait_until(succeeded, timeout=GROUP_EMPTY_TIMEOUT, interval=0.5,
                   message=lambda: f"group {group_id} did not become empty: {last_error}")
    except WaitTimeout as error:
        raise CommandRejected(str(error)) from None


def _expire_offsets(agent: AgentContext, lab: Lab, group_id: str, kafka_group_id: str, members: list) -> dict:
    """What the broker does once a group has been empty for offsets.retention.minutes (7 days by
    default): its committed offsets are gone, and its members start where auto.offset.reset says.

    The lab does not wait seven days, nor delete the group (Tansu deletes a group that still has a
    member, and the group then wedges: docs/concepts/broker.md). Once the broker says the group is
    empty, as Kafka requires before offsets can expire, it moves the group to a fresh Kafka group id
    that has no committed offset: what a consumer meets after the expiry, to the byte."""
    def empty() -> str | None:
        state = group_state(agent.admin, kafka_group_id)
        return None if state in ("EMPTY", "DEAD") else f"the broker says the group is {state}, not empty"
    _once_the_group_is_empty(group_id, empty)
    new_id = lab.moved_group_id(group_id, Lab.moves_of(kafka_group_id, group_id) + 1)
    group_health.move_group(agent.conn.execute, lab, group_id, new_id)
    agent.say(lab, "offsets-reset", f"{group_id}: moved to Kafka group id {new_id}, which has no committed offset, "
              "as the broker leaves an empty group once its offsets expire after offsets.retention.minutes; its "
              "consumers start at auto.offset.reset (earliest: every record the topic still retains)",
              group=group_id, kafka_group_id=new_id, offsets={})
    snapshot_offsets(agent.conn, agent.admin, lab)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_RESTART)
    return {"group_id": group_id, "kafka_group_id": new_id, "offsets": {}, "restarted": [row.id for row in members]}


def reset_group(agent: AgentContext, lab: Lab, command: commands.GroupReset) -> dict:
    """Stop the group's consumers, move its committed offsets, restart them."""
    group_id = lab.group_id(command.group)
    try:
        reset = OffsetReset(mode=command.mode, offsets=dict(command.offsets or {}) or None, back=command.back,
                            timestamp=command.timestamp)
    except (TypeError, ValueError) as error:
        raise CommandRejected(str(error)) from None
    members = _live_members(agent, lab, group_id)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_STOP)
    agent.say(lab, "offsets-reset", f"stopped {len(members)} consumer(s) of {group_id}: Kafka moves a "
              "group's offsets only while the group is empty", group=group_id)
    kafka_group_id = group_health.kafka_group_id(agent.conn.execute, lab, group_id)
    if reset.mode == "expire":
        return _expire_offsets(agent, lab, group_id, kafka_group_id, members)
    try:
        targets = target_offsets(agent.admin, kafka_group_id, lab.topic, reset)
    except ValueError as error:
        raise CommandRejected(str(error)) from None
    def alter() -> str | None:
        try:
            alter_offsets(agent.admin, kafka_group_id, lab.topic, targets)
            return None
        except KafkaException as error:
            return str(error)
    _once_the_group_is_empty(group_id, alter)
    agent.say(lab, "offsets-reset", f"{group_id} reset ({reset.mode}) to "
              + ", ".join(f"p{p}@{o}" for p, o in sorted(targets.items())), group=group_id,
              offsets={str(p): o for p, o in targets.items()})
    snapshot_offsets(agent.conn, agent.admin, lab)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_RESTART)
    return {"group_id": group_id, "offsets": {str(p): o for p, o in targets.items()},
            "restarted": [row.id for row in members]}


# How long recovery waits for the broker to assign the restarted members before it moves the group:
# fresh members that all poll are assigned within a session timeout on a working broker (the first
# join on Tansu waits about half of it, docs/concepts/broker.md); twice that leaves room for one more rebalance.
RECOVERY_ASSIGNMENT_WAIT = 2 * SESSION_TIMEOUT_MS / 1000


def _assigned(agent: AgentContext, lab: Lab, group_id: str) -> tuple[list[int], int]:
    """The partitions the group's live members report, and the topic's partition count."""
    with agent.engine.connect() as conn:
        members = consumer_rows.live(conn, lab.name, group_id)
    ids = [row.id for row in members]
    assigned = set()
    if ids:
        for (partitions,) in agent.conn.execute(
                f"SELECT assigned FROM {consumer_rows.consumers.fullname} WHERE id = ANY(%s) AND state = 'running'",
                [ids]).fetchall():
            assigned.update(partitions or [])
    row = agent.conn.execute(f'SELECT value FROM {quoted(lab.schema)}.settings WHERE key = %s', ["partitions"]).fetchone()
    return sorted(assigned), int(row[0]) if row else DEFAULT_PARTITIONS


def _wait_assigned(agent: AgentContext, lab: Lab, group_id: str, timeout: float) -> bool:
    """Whether the group's members report every partition assigned within ``timeout`` seconds."""
    def every_partition() -> bool:
        assigned, partitions = _assigned(agent, lab, group_id)
        return len(assigned) >= partitions
    try:
        wait_until(every_partition, timeout=timeout, interval=0.25, message="not assigned")
        return True
    except WaitTimeout:
        return False


def _restart_members(agent: AgentContext, lab: Lab, members: list[consumer_rows.Row]) -> None:
    """Stop every member first (each leaves the group), then start them all: one rebalance, not one each."""
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_STOP)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_RESTART)


def recover_group(agent: AgentContext, lab: Lab, command: commands.GroupRecover) -> dict:
    """Recover a group the broker does not assign: restart its members; if the broker still assigns
    them nothing within RECOVERY_ASSIGNMENT_WAIT, move the group to a fresh Kafka group id with its
    committed offsets (read from the wedged group, committed for the new id while it is empty, before
    any member starts), and start them there. Every step is said on the timeline and in the result."""
    group_id = lab.group_id(command.group)
    members = _live_members(agent, lab, group_id)
    if not members:
        raise CommandRejected(f"group: group {group_id} has no live member to recover: start a consumer in it")
    why = "automatically, stalled past its threshold" if command.automatic else "on request"
    group_health.start_recovery(agent.conn.execute, lab, group_id)
    steps: list[str] = []
    _restart_members(agent, lab, members)
    steps.append(f"restarted {len(members)} member(s): {', '.join(row.name for row in members)}")
    agent.say(lab, "recovery", f"recovering {group_id} ({why}): {steps[-1]}", group=group_id)
    old_id = group_health.kafka_group_id(agent.conn.execute, lab, group_id)
    if _wait_assigned(agent, lab, group_id, RECOVERY_ASSIGNMENT_WAIT):
        steps.append(f"the broker assigned every partition within {RECOVERY_ASSIGNMENT_WAIT:g} s")
        agent.say(lab, "recovery", f"{group_id} recovered by the restart: {steps[-1]}", group=group_id)
        return {"group_id": group_id, "kafka_group_id": old_id, "moved": False, "steps": steps, "assigned": True}
    # The broker keeps the group in a rebalance it does not finish (Tansu, docs/concepts/broker.md): leave it behind.
    with agent.engine.connect() as conn:
        members = consumer_rows.live(conn, lab.name, group_id)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_STOP)
    try:
        offsets = {p: o for p, o in committed_offsets(agent.admin, old_id, lab.topic).items() if o is not None}
        new_id = lab.moved_group_id(group_id, Lab.moves_of(old_id, group_id) + 1)
        alter_offsets(agent.admin, new_id, lab.topic, offsets)
    except KafkaException as error:
        for row in members:
            on_own_or_remote(agent, lab, row, verbs.CONSUMER_RESTART)
        raise CommandRejected(f"group: could not carry {group_id}'s committed offsets over: {error}") from None
    group_health.move_group(agent.conn.execute, lab, group_id, new_id)
    carried = ", ".join(f"P{p}@{o}" for p, o in sorted(offsets.items())) or "none committed yet"
    steps.append(f"the broker assigned nothing within {RECOVERY_ASSIGNMENT_WAIT:g} s: moved the group from Kafka "
                 f"group id {old_id} to {new_id}, committed offsets carried over ({carried})")
    agent.say(lab, "recovery", f"{group_id}: {steps[-1]}", group=group_id, kafka_group_id=new_id,
              offsets={str(p): o for p, o in offsets.items()})
    snapshot_offsets(agent.conn, agent.admin, lab)
    for row in members:
        on_own_or_remote(agent, lab, row, verbs.CONSUMER_RESTART)
    assigned = _wait_assigned(agent, lab, group_id, RECOVERY_ASSIGNMENT_WAIT)
    steps.append(f"restarted {len(members)} member(s) in {new_id}: "
                 + ("every partition assigned" if assigned else "not every partition assigned yet"))
    agent.say(lab, "recovery", f"{group_id}: {steps[-1]}", group=group_id)
    return {"group_id": group_id, "kafka_group_id": new_id, "moved": True, "offsets": {str(p): o for p, o in offsets.items()},
            "steps": steps, "assigned": assigned}


HANDLERS: dict[str, Handler] = {
    verbs.GROUP_RECOVER: recover_group,
    verbs.PUBLISH: publish,
    verbs.PRODUCE_RAW: produce_raw,
    verbs.CONSUMER_START: start_consumer,
    verbs.CONSUMER_STOP: stop_consumer,
    verbs.CONSUMER_KILL: kill_consumer,
    verbs.CONSUMER_FREEZE: freeze_consumer,
    verbs.CONSUMER_THAW: thaw_consumer,
    verbs.CONSUMER_RESTART: restart_consumer,
    verbs.GROUP_RESET: reset_group,
    verbs.LAB_RESET: reset_lab,
    verbs.TOPIC_RETENTION: set_topic_retention,
    verbs.LAB_ENSURE: ensure_lab,
    verbs.LAB_DROP: drop_lab,
    verbs.LANE_KAFKA_PRINCIPAL: grant_lane_principal,
    verbs.CHAOS_START: chaos_runner.start,
    verbs.LOAD_START: start_load,
    verbs.DEDUP_WARMUP: start_warmup,
    verbs.EXPLORATION_START: start_exploration,
}
