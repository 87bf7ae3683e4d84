"""The lab as a whole: its dedup-table TTL (set, clean up now) and a reset to a fresh lab."""
from __future__ import annotations

from pydantic import model_validator

from ..domain import commands, verbs
from ..domain.group_health import MAX_POLL_INTERVAL_SETTING, lock_timeout_ms, max_poll_interval_ms, statement_timeout_ms
from ..domain.vocabulary import DEFAULT_TTL_SECONDS, Limits
from ..store import labdata, schema
from ..store.labs import lab_schemas
from ..strategies import ttl
from .agent_commands import run_command
from .fields import Number, Whole, within
from .registry import Args, Context, InvalidRequest, NoArgs, operation


class TtlArgs(Args):
    ttl_seconds: Number = within(Limits.TTL_SECONDS, "dedup keys older than this are deleted by the cleanup",
                                 "ttl_seconds", "seconds", unit=" s")
    ttl_schedule_seconds: Number = within(Limits.TTL_SECONDS, "run the cleanup on this schedule (0: on demand only)",
                                          "ttl_schedule_seconds", "schedule_seconds", unit=" s")

    @model_validator(mode="after")
    def _something_to_set(self) -> "TtlArgs":
        if self.ttl_seconds is None and self.ttl_schedule_seconds is None:
            raise InvalidRequest("ttl_seconds", "give ttl_seconds and/or ttl_schedule_seconds")
        return self


class CleanupArgs(Args):
    ttl_seconds: Number = within(Limits.TTL_SECONDS, "the window for this cleanup (default: the lab's TTL)",
                                 "ttl_seconds", "seconds", unit=" s")


class DatabaseSettingsArgs(Args):
    lock_timeout_ms: Whole = within(Limits.SESSION_TIMEOUT_MS, "a statement waiting for a lock longer than this "
                                    "fails (lock_timeout; 0: no lab limit, the consumer's own bound below "
                                    "max.poll.interval.ms applies)", unit=" ms")
    idle_in_transaction_session_timeout_ms: Whole = within(
        Limits.SESSION_TIMEOUT_MS, "a session idle inside an open transaction longer than this is terminated by "
        "PostgreSQL, its transaction rolled back (a frozen zombie's; 0: never)", unit=" ms")

    @model_validator(mode="after")
    def _something_to_set(self) -> "DatabaseSettingsArgs":
        if self.lock_timeout_ms is None and self.idle_in_transaction_session_timeout_ms is None:
            raise InvalidRequest("lock_timeout_ms", "give lock_timeout_ms and/or idle_in_transaction_session_timeout_ms")
        return self


class TopicRetentionArgs(Args):
    retention_ms: Whole = within(Limits.TOPIC_RETENTION_MS, "the topic's retention.ms: Apache Kafka deletes a "
                                 "segment once its newest record is older than this", "retention_ms", "retention",
                                 unit=" ms")
    segment_ms: Whole = within(Limits.TOPIC_RETENTION_MS, "the topic's segment.ms: the active segment is rolled "
                               "at the first append after it is this old", "segment_ms", "segment", unit=" ms")

    @model_validator(mode="after")
    def _something_to_set(self) -> "TopicRetentionArgs":
        if self.retention_ms is None and self.segment_ms is None:
            raise InvalidRequest("retention_ms", "give retention_ms and/or segment_ms")
        return self

    def command(self) -> commands.TopicRetention:
        """The agent's ``topic.retention`` for these arguments."""
        return self.as_command(commands.TopicRetention)


class ResetArgs(Args):
    partitions: Whole = within(Limits.PARTITIONS, "partitions of the new payments topic (default: LAB_PARTITIONS)")


@operation("get_ttl", method="GET", path="/ttl", tags=("dedup",), summary="The dedup-table TTL and its schedule")
def get_ttl(ctx: Context, args: NoArgs) -> dict:
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        values = labdata.settings(conn, prefix="ttl")
    return {"ttl_seconds": values.get("ttl_seconds", DEFAULT_TTL_SECONDS),
            "ttl_schedule_seconds": values.get("ttl_schedule_seconds")}


@operation("set_ttl", path="/ttl", step="ttl", cli="ttl", tags=("dedup",),
           summary="Set the dedup-table TTL and/or the cleanup's schedule")
def set_ttl(ctx: Context, args: TtlArgs) -> dict:
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        if args.ttl_seconds is not None:
            labdata.put_setting(conn, "ttl_seconds", args.ttl_seconds)
        if args.ttl_schedule_seconds is not None:
            labdata.put_setting(conn, "ttl_schedule_seconds", args.ttl_schedule_seconds or None)
    return get_ttl(ctx, NoArgs())


@operation("ttl_cleanup", path="/ttl/cleanup", step="ttl_cleanup", tags=("dedup",),
           summary="Run the TTL DELETE now, in the lab's schema and every lane's")
def ttl_cleanup(ctx: Context, args: CleanupArgs) -> dict:
    window = args.ttl_seconds if args.ttl_seconds is not None else get_ttl(ctx, NoArgs())["ttl_seconds"]
    deleted: dict[str, dict[str, int]] = {}
    with ctx.engine.begin() as conn:
        for lab_schema in lab_schemas(conn, ctx.lab):
            schema.enter(conn, lab_schema)
            deleted[lab_schema] = ttl.cleanup(conn.exec_driver_sql, window)
        schema.enter(conn, ctx.lab.schema)
        total = sum(n for counts in deleted.values() for n in counts.values())
        labdata.say(conn, "ttl", f"TTL cleanup (older than {window:g}s) deleted {total} key(s)", deleted=deleted)
    return {"ttl_seconds": window, "deleted": deleted}


DATABASE_SETTINGS = ("lock_timeout_ms", "idle_in_transaction_session_timeout_ms")


@operation("get_database_settings", method="GET", path="/database-settings", tags=("lab",),
           summary="The consumers' database session settings: lock_timeout, idle_in_transaction_session_timeout")
def get_database_settings(ctx: Context, args: NoArgs) -> dict:
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        values = labdata.settings(conn)
    chosen = {key: int(values.get(key) or 0) for key in DATABASE_SETTINGS}
    # What the consumers' effects connections run with: the lab's settings bounded below their
    # max.poll.interval.ms (domain/group_health.py), so no statement keeps one from polling.
    poll_interval = max_poll_interval_ms(values.get(MAX_POLL_INTERVAL_SETTING))
    return {**chosen, "max_poll_interval_ms": poll_interval,
            "effective_lock_timeout_ms": lock_timeout_ms(chosen["lock_timeout_ms"], poll_interval),
            "statement_timeout_ms": statement_timeout_ms(poll_interval)}


@operation("set_database_settings", settles=True, path="/database-settings", step="database_settings", cli="database-settings",
           tags=("lab",), summary="Set the consumers' lock_timeout and idle_in_transaction_session_timeout "
                                  "(from their next message)")
def set_database_settings(ctx: Context, args: DatabaseSettingsArgs) -> dict:
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        for key in DATABASE_SETTINGS:
            if getattr(args, key) is not None:
                labdata.put_setting(conn, key, getattr(args, key))
        labdata.say(conn, "lab", "database settings: " + ", ".join(
            f"{key.removesuffix('_ms')} {getattr(args, key)} ms" for key in DATABASE_SETTINGS
            if getattr(args, key) is not None))
    return get_database_settings(ctx, NoArgs())


@operation("set_topic_retention", path="/topic/retention", step="topic_retention", recorded=True, tags=("lab",),
           summary="Set the lab's topic's retention.ms and/or segment.ms (Apache Kafka's log retention)")
def set_topic_retention(ctx: Context, args: TopicRetentionArgs) -> dict:
    return run_command(ctx, verbs.TOPIC_RETENTION, args.command(), field="retention_ms")


@operation("reset_lab", path="/lab/reset", recorded=True, cli="", tags=("lab",),
           summary="Wipe the lab (tables and topics) and seed five accounts")
def reset_lab(ctx: Context, args: ResetArgs) -> dict:
    partitions = args.partitions or ctx.config.get("LAB_PARTITIONS", 3)
    return run_command(ctx, verbs.LAB_RESET, commands.LabSetup(partitions=partitions), field="partitions")
