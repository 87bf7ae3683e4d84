"""What a consumer applies, told to it when it changes instead of read before every record.

A consumer applies its control row (armed fault, step mode) and its group's settings (strategy,
database settings, batch and commit mode, notification), and a change made before a record was
polled applies to that record. It used to read them before every record: one round trip per
record, 14% of the consumer's time, for rows that change a few times a class. Now:

- **Every change says so, whoever makes it.** Triggers ``NOTIFY lab_settings`` with the lab's
  name, in the writer's own transaction (so at its commit): on ``lab_control.consumers`` when a
  fault or step-mode column changes or a row is deleted (a lab reset), and on each lab's
  ``consumer_groups`` and ``settings``. An operation, the agent, or a person in psql: all the same.
- **A consumer looks before each record at what its socket already holds.** It LISTENs on its
  control connection; after a poll, it reads what PostgreSQL has sent (no round trip) and, on a
  notification for its lab, reads its settings again (consumer/settings.py). The read also records
  when it was done (``settings_seen_at``, the statement's timestamp): its acknowledgement.
- **An operation that changes them returns once they are seen** (``settle``): it waits until every
  running consumer of the lab has read its settings after the change was committed, at most
  SETTLE_SECONDS. A consumer that cannot answer meanwhile (frozen, stepping, waiting on a lock, in
  the middle of a long record) has the notification on its socket when it moves on, and reads it
  before its next record. The consumer's heartbeat also reads its settings (every 0.5 s).
"""
from __future__ import annotations

from sqlalchemy import Engine, text

from ..domain.lab import Lab
from ..domain.vocabulary import SETTINGS_CHANNEL
from ..domain.waits import WaitTimeout, wait_until
from .connection import CONTROL_SCHEMA
from .schema import notify_lab_function, quoted

CHANNEL = SETTINGS_CHANNEL
# What an operation waits at most for the running consumers' acknowledgements: a consumer idle in
# poll() answers within its poll timeout (0.2 s); one in the middle of a record, when it is done.
SETTLE_SECONDS = 2.0

# The columns of a consumer's control row that it applies (the rest is its report, or the step
# counter it waits on by itself).
CONTROL_COLUMNS = ("armed_point", "armed_action", "armed_always", "step_mode")


def control_trigger_ddl() -> list[str]:
    """The trigger on ``lab_control.consumers``; idempotent."""
    table = f"{CONTROL_SCHEMA}.consumers"
    function = f"{CONTROL_SCHEMA}.consumer_settings_changed"
    changed = " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in CONTROL_COLUMNS)
    return [
        notify_lab_function(function, CHANNEL),
        f"DROP TRIGGER IF EXISTS settings_changed ON {table}",
        f"CREATE TRIGGER settings_changed AFTER UPDATE ON {table} FOR EACH ROW WHEN ({changed}) "
        f"EXECUTE FUNCTION {function}()",
        f"DROP TRIGGER IF EXISTS settings_deleted ON {table}",
        f"CREATE TRIGGER settings_deleted AFTER DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()",
    ]


def lab_trigger_ddl(schema: str) -> list[str]:
    """The triggers on a lab schema's ``consumer_groups`` and ``settings``; idempotent. (A lane's
    schema has the tables too, unused: its triggers name the lab, which is harmless.)"""
    s = quoted(schema)
    lab_name = Lab.of_schema(schema).name.replace("'", "''")
    statements = [f"""CREATE OR REPLACE FUNCTION {s}.settings_changed() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{CHANNEL}', TG_ARGV[0]);
    RETURN NULL;
END $fn$"""]
    for table in ("consumer_groups", "settings"):
        statements.append(f"DROP TRIGGER IF EXISTS settings_changed ON {s}.{table}")
        statements.append(f"CREATE TRIGGER settings_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {s}.{table} "
                          f"FOR EACH STATEMENT EXECUTE FUNCTION {s}.settings_changed('{lab_name}')")
    return statements


# The running consumers of a lab that have not read their settings since :since.
UNSEEN_SQL = f"""
SELECT name FROM {CONTROL_SCHEMA}.consumers
WHERE lab = :lab AND state = 'running' AND pid IS NOT NULL
  AND (settings_seen_at IS NULL OR settings_seen_at < :since)
ORDER BY name
"""


def settle(engine: Engine, lab: Lab, timeout: float = SETTLE_SECONDS) -> list[str]:
    """Wait until every running consumer of ``lab`` has read its settings since now (call it after
    the change committed). Returns the names of those that had not after ``timeout`` seconds."""
    with engine.connect() as conn:
        since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        unseen: list[str] = []

        def all_seen() -> bool:
            unseen[:] = conn.execute(text(UNSEEN_SQL), {"lab": lab.name, "since": since}).scalars().all()
            conn.rollback()  # a fresh snapshot each look
            return not unseen
        try:
            wait_until(all_seen, timeout=timeout, interval=0.02, message="")
        except WaitTimeout:
            pass  # reported to the caller: those consumers read it before their next record
    return unseen
