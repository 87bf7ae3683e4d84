"""The lab agent: the only process (with the consumers it starts) that holds Kafka clients.
May import kafka, logreader, faultproxy, strategies, summary, settings, store and domain; never web or Flask.

Web processes never touch Kafka: they write commands to PostgreSQL (webapp/store/command_channel.py) and read
what the agents and the consumers report there. An agent
- claims commands with a lease and carries them out (queue.py, handlers.py): publish,
  start/stop/kill/freeze/thaw/restart consumers, reset a group's offsets, ensure or reset a lab;
  several at once on its command workers (workers.py), a lab's one at a time in their order;
- owns the consumer processes on its host (processes.py) and records how each one ended;
- beats on a thread of its own, reaps what dead agents left (commands, consumers), looks at the
  broker, snapshots committed offsets and runs scheduled TTL cleanups (periodic.py).
Several agents (one per container) can serve one database: commands about a consumer go to its
owner, the others to whichever agent claims them first. Lab setup without an agent: setup.py.
Handlers are typed against context.AgentContext; the outbox relays it keeps: relays.py. Only the
entry point (``__main__``) imports scenarios, to wire guided mode's ``scenario.step``.

This package's ``__init__`` imports nothing, so importing ``webapp.agent`` loads no Kafka client.
"""


def main(extra_handlers=None) -> int:
    """Run an agent in the foreground until SIGTERM; the exit code (see loop.main)."""
    from .loop import main as run

    return run(extra_handlers)
