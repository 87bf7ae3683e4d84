"""Revision 16: every lab's faults are its own.

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-03

- ``lab_control.fault_proxy_labs``: one row per fault proxy and lab: the faults that lab armed
  (drops, delay, blocked commits, connection cuts) and the proxy's counters of that lab's clients.
  The proxy matches them only to requests whose Kafka client id names the lab.
- ``lab_control.fault_proxies`` keeps the process's report, the settings' version and the whole
  proxy's counters; its per-lab columns go (a setting armed before the upgrade is dropped: a proxy
  starts disarmed anyway).

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

CONTROL = [
    """CREATE TABLE IF NOT EXISTS lab_control.fault_proxy_labs (
        proxy VARCHAR(64) NOT NULL,
        lab VARCHAR(32) NOT NULL,
        drop_produce_responses INTEGER DEFAULT '0' NOT NULL,
        delay_ms INTEGER DEFAULT '0' NOT NULL,
        armed_at TIMESTAMP WITHOUT TIME ZONE,
        blocked_commits JSONB DEFAULT '{}' NOT NULL,
        cut_version BIGINT DEFAULT '0' NOT NULL,
        cut_client_ids JSONB DEFAULT '[]' NOT NULL,
        seen_cut_version BIGINT DEFAULT '0' NOT NULL,
        blocked_seen JSONB DEFAULT '[]' NOT NULL,
        connections INTEGER DEFAULT '0' NOT NULL,
        produce_requests BIGINT DEFAULT '0' NOT NULL,
        responses_dropped BIGINT DEFAULT '0' NOT NULL,
        responses_delayed BIGINT DEFAULT '0' NOT NULL,
        commits_blocked BIGINT DEFAULT '0' NOT NULL,
        connections_cut BIGINT DEFAULT '0' NOT NULL,
        PRIMARY KEY (proxy, lab))""",
] + [f"ALTER TABLE lab_control.fault_proxies DROP COLUMN IF EXISTS {column}" for column in (
    "lab", "drop_produce_responses", "delay_ms", "armed_at", "blocked_commits", "blocked_seen", "cut_version",
    "cut_client_ids", "seen_cut_version")]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
