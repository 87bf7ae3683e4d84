"""A group's throughput settings: batch mode, commit mode, static membership.

Per-message mode (batch_size 1) is the teaching default. Batch mode consumes up to batch_size
records (waiting at most batch_max_wait_ms), applies them in one transaction with set-based SQL
and commits their offsets once. The commit mode is sync (wait for the broker), async (do not
wait: faster, and a crash can lose the commits in flight) or transactional (the offsets committed
in a Kafka transaction of each consumer's own; the PostgreSQL effect stays outside it). Static membership gives each consumer
a group.instance.id that survives a restart; it needs the consumer restarted to apply.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..domain.vocabulary import COMMIT_MODES, Limits
from .fields import Whole, within
from .groups import GroupRef, _group_settings, _update_group
from .registry import Context, InvalidRequest, operation

SETTINGS = ("batch_size", "batch_max_wait_ms", "commit_mode", "static_membership")


class ThroughputArgs(GroupRef):
    batch_size: Whole = within(Limits.BATCH_SIZE, "records per batch; 1 is per-message mode (from the next "
                                                  "message or batch)")
    batch_max_wait_ms: Whole = within(Limits.BATCH_MAX_WAIT_MS, "how long a batch waits to fill", unit=" ms")
    commit_mode: Literal[COMMIT_MODES] | None = Field(
        None, description="sync: wait for the broker's answer to each offset commit; async: do not wait (faster; a "
                          "crash can lose the commits in flight, so more records come back); transactional: in a Kafka transaction "
                          "of each consumer's own (send_offsets_to_transaction, commit_transaction), which the "
                          "PostgreSQL effect is not part of")
    static_membership: bool | None = Field(
        None, description="a group.instance.id per consumer: a restarted consumer takes its old place at once "
                          "instead of waiting for its session to time out (applies when a consumer restarts)")

    @model_validator(mode="after")
    def _something_to_change(self) -> "ThroughputArgs":
        if all(getattr(self, name) is None for name in SETTINGS):
            raise InvalidRequest("batch_size", f"give at least one of {', '.join(SETTINGS)}")
        return self


def _describe(changed: dict) -> str:
    words = []
    if "batch_size" in changed:
        words.append("per-message mode" if changed["batch_size"] == 1 else f"batches of up to {changed['batch_size']}")
    if "batch_max_wait_ms" in changed:
        words.append(f"a batch waits at most {changed['batch_max_wait_ms']} ms")
    if "commit_mode" in changed:
        words.append(f"{changed['commit_mode']} offset commits")
    if "static_membership" in changed:
        words.append("static membership " + ("on" if changed["static_membership"] else "off")
                     + " (from each consumer's next start)")
    return ", ".join(words)


@operation("set_throughput", settles=True, path="/groups/<group>/throughput", step="throughput", cli="throughput",
           tags=("groups",), summary="A group's batch mode, commit mode and static membership")
def set_throughput(ctx: Context, args: ThroughputArgs) -> dict:
    changed = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    if changed.get("batch_size", 1) > 1 and _group_settings(ctx, args.group).notify != "off":
        # Batch mode has no per-credit step for the notification call: refused rather than silently not sent.
        raise InvalidRequest("batch_size", f"group {args.group} notifies the customer of each credit; batch mode "
                             "does not call the notification service: turn notifications off first")
    group_id = _update_group(ctx, args.group, f"{{group_id}}: {_describe(changed)}", **changed)
    return {"group_id": group_id, **changed,
            "restart_needed": ["static_membership"] if "static_membership" in changed else []}
