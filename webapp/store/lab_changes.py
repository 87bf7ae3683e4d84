"""The change feed of the live panels: whatever changes a lab's data says so.

Statement triggers on every table of a lab (and lane) schema, and row triggers on the control
tables whose rows name a lab (the consumers, the guided runs, the attendees), run ``pg_notify('lab_change', <lab name>)`` in the writer's own
transaction: a consumer's transaction, the log reader, a control, the agent, a person in psql, the
learner's own code. PostgreSQL delivers a notification at its transaction's commit, never for a
rolled-back one, and folds identical notifications of one transaction into one; so a transaction,
whatever it wrote, announces its lab once. The web processes LISTEN (web/push.py) and turn an
announcement into at most a few pushes a second per lab.

Except the lab's consumers' effect transactions: a session that sets ``lab.change_feed`` to
``reported`` (QUIET_SESSION) announces nothing from the lab tables. A transaction that has
notified takes PostgreSQL's notify queue lock at commit (one lock for the whole cluster: an
AccessExclusiveLock on object 0 of pg_database, held until the commit is done) and wakes every
backend that LISTENs in the database (every lab consumer's control connection does); with one
such transaction per record, every consumer's commit woke every listener (bench/change_feed.py:
eight writers beside sixty listeners committed 1,153 transactions a second announcing, 3,468
quiet). A consumer announces its work instead through its report (its row in the consumers
control table, below), which it writes at once after an effect that follows a quiet spell and at
most twice a second under load (webapp/consumer/report.py).

What changes with time alone (the agent's heartbeat growing old, a key's age) writes nothing:
web/push.py looks again once a second per lab as well.
"""
from __future__ import annotations

from typing import Iterable

from ..domain.lab import Lab
from ..domain.vocabulary import LAB_CHANGE_CHANNEL
from .connection import CONTROL_SCHEMA
from .schema import notify_lab_function, quoted

CHANNEL = LAB_CHANGE_CHANNEL
TRIGGER = "lab_changed"
# The session setting of a writer whose changes of lab tables are announced another way (a lab
# consumer's effects connection: its report announces them).
QUIET_SETTING = "lab.change_feed"
QUIET_SESSION = f"SET {QUIET_SETTING} = 'reported'"
ANNOUNCES = f"current_setting('{QUIET_SETTING}', true) IS DISTINCT FROM 'reported'"


def lab_trigger_ddl(schema: str, tables: Iterable[str] | None = None) -> list[str]:
    """The change triggers of one lab (or lane) schema, on every lab table (or on ``tables``, those
    of them a migration finds: a revision runs before the later ones create their tables);
    idempotent. A lane's triggers name its lab: the lab's panels show its lanes. A quiet session
    (QUIET_SESSION) does not even run the function: the trigger's WHEN is false."""
    from .tables import lab_tables

    s = quoted(schema)
    lab_name = Lab.of_schema(schema).name.replace("'", "''")
    statements = [f"""CREATE OR REPLACE FUNCTION {s}.{TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{CHANNEL}', TG_ARGV[0]);
    RETURN NULL;
END $fn$"""]
    for table in lab_tables():
        if tables is not None and table.name not in tables:
            continue
        statements.append(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {s}.{quoted(table.name)}")
        statements.append(f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "
                          f"{s}.{quoted(table.name)} FOR EACH STATEMENT WHEN ({ANNOUNCES}) EXECUTE FUNCTION {s}.{TRIGGER}('{lab_name}')")
    return statements


# The control tables whose rows name a lab and whose changes a screen shows: the consumers (the
# dashboard), the guided runs (the run page, the presenter's step line, the board), the attendees
# (the board).
CONTROL_TABLES = ("consumers", "scenario_runs", "attendees")
# A consumer writes its row every half second whether or not anything changed but its heartbeat: an
# update that changes nothing else announces nothing (a stale heartbeat shows through web/push.py's
# once-a-second look, as it writes nothing either).
MORE_THAN_THE_HEARTBEAT_CHANGED = "(to_jsonb(OLD) - 'heartbeat_at') IS DISTINCT FROM (to_jsonb(NEW) - 'heartbeat_at')"


def control_trigger_ddl() -> list[str]:
    """The change triggers of the control tables that name a lab (CONTROL_TABLES); idempotent. A row
    trigger announces the row's lab; on the consumers, an update of the heartbeat alone does not."""
    function = f"{CONTROL_SCHEMA}.{TRIGGER}"
    statements = [notify_lab_function(function, CHANNEL)]
    for name in CONTROL_TABLES:
        table = f"{CONTROL_SCHEMA}.{name}"
        statements += [f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}",
                       f"DROP TRIGGER IF EXISTS {TRIGGER}_update ON {table}"]
        if name == "consumers":
            statements += [
                f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()",
                f"CREATE TRIGGER {TRIGGER}_update AFTER UPDATE ON {table} FOR EACH ROW "
                f"WHEN ({MORE_THAN_THE_HEARTBEAT_CHANGED}) EXECUTE FUNCTION {function}()"]
        else:
            statements.append(f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {table} FOR EACH ROW "
                              f"EXECUTE FUNCTION {function}()")
    return statements
