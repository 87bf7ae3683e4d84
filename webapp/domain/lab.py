"""The lab namespace: one PostgreSQL schema and one topic prefix, named both ways.

The default lab, each scenario run and each strategy lane is a Lab. Nothing else names a schema,
a topic or a group id: everything takes the Lab it works in, and parses names back through it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
NAME_RULE = "must start with a letter: 1-24 lowercase letters, digits or _"
SCHEMA_PREFIX = "lab_"
LANE_SEPARATOR = "__"
# Every Kafka client of a lab has an id "lab-<lab>" followed by "-<consumer>" or ".<role>": a lab
# name holds neither "-" nor ".", so the id names its lab unambiguously (Lab.of_client_id).
CLIENT_ID_PREFIX = "lab-"
CLIENT_ID = re.compile(r"^lab-([a-z][a-z0-9_]{0,23})[-.]")


class InvalidLabName(ValueError):
    pass


@dataclass(frozen=True)
class Lab:
    name: str

    def __post_init__(self):
        if not NAME.match(self.name):
            raise InvalidLabName(
                f"lab name must start with a letter and hold 1-24 lowercase letters, digits or _: {self.name!r}")

    # --- names from the lab ----------------------------------------------------------------
    @property
    def schema(self) -> str:
        return f"{SCHEMA_PREFIX}{self.name}"

    @property
    def topic(self) -> str:
        return f"{self.name}.payments"

    @property
    def dlq_topic(self) -> str:
        return f"{self.name}.payments.dlq"

    def group_id(self, group: str) -> str:
        """The Kafka group id of a group name local to this lab."""
        return group if group.startswith(f"{self.name}.") else f"{self.name}.{group}"

    def moved_group_id(self, group_id: str, moves: int) -> str:
        """The Kafka group id of ``group_id`` after its ``moves``-th move to a fresh id: a recovery that
        had to leave a wedged group behind (ops recover_group), or an expiry of its committed offsets
        (reset mode ``expire``): ``default.payments.r1``. The lab keeps calling the group by
        its own id (reports, deliveries, offsets snapshots); only its members' Kafka config changes."""
        return f"{self.group_id(group_id)}.r{moves}"

    @staticmethod
    def moves_of(kafka_group_id: str, group_id: str) -> int:
        """How often a group was moved: 0 for its own id, n for ``<group_id>.r<n>``."""
        suffix = kafka_group_id.removeprefix(f"{group_id}.r") if kafka_group_id != group_id else "0"
        return int(suffix) if suffix.isdigit() else 0

    def client_id(self, consumer: str) -> str:
        """The Kafka client id of one of the lab's consumers: what the fault proxy sees of it, so
        chaos can cut that consumer's broker connections and no other lab's."""
        return f"{CLIENT_ID_PREFIX}{self.name}-{consumer}"

    @property
    def producer_client_id(self) -> str:
        """The Kafka client id of every producer of the lab (the agent's, its load generator's, the
        outbox relay's, the consumers' dead-letter producers): the fault proxy's faults armed by
        this lab act on these requests and no other lab's. A consumer name cannot contain ".", so
        no consumer of the lab has this id."""
        return f"{CLIENT_ID_PREFIX}{self.name}.producer"

    def owns_client_id(self, client_id: str | None) -> bool:
        """Whether a Kafka client id is one of this lab's (a consumer's or its producers')."""
        return Lab.of_client_id(client_id) == self

    def lane_schema(self, lane: str) -> str:
        """The schema of a strategy lane: its own copy of the accounts."""
        if not NAME.match(lane):
            raise InvalidLabName(f"lane name must be lowercase letters, digits or _: {lane!r}")
        return f"{self.schema}{LANE_SEPARATOR}{lane}"

    def lane_role(self, lane: str) -> str:
        """The PostgreSQL role of an outside consumer's lane: named as the lane's schema,
        so the name says whose it is, and no two labs' lanes share one."""
        return self.lane_schema(lane)

    # --- names back to the lab -------------------------------------------------------------
    def local_group(self, group_id: str) -> str:
        """``default.payments`` → ``payments``; a name that is already local is returned as is."""
        return group_id.removeprefix(f"{self.name}.")

    def lane_of(self, schema: str) -> str | None:
        """The lane a schema of this lab belongs to; None for the lab's own schema."""
        if not self.owns_schema(schema) or schema == self.schema:
            return None
        return schema.removeprefix(f"{self.schema}{LANE_SEPARATOR}")

    def owns_schema(self, schema: str) -> bool:
        return schema == self.schema or schema.startswith(f"{self.schema}{LANE_SEPARATOR}")

    @classmethod
    def of_schema(cls, schema: str) -> "Lab":
        """The lab a schema (its own or a lane's) belongs to."""
        if not schema.startswith(SCHEMA_PREFIX):
            raise InvalidLabName(f"not a lab schema: {schema!r}")
        return cls(schema.removeprefix(SCHEMA_PREFIX).split(LANE_SEPARATOR, 1)[0])

    @classmethod
    def of_client_id(cls, client_id: str | None) -> "Lab | None":
        """The lab whose client a Kafka client id names (``lab-t1-c1``, ``lab-t1.producer``: t1);
        None for any other client (an admin client, the log reader, a tool's)."""
        match = CLIENT_ID.match(client_id or "")
        return cls(match.group(1)) if match else None

    @classmethod
    def of_group_id(cls, group_id: str) -> "Lab":
        return cls(group_id.split(".", 1)[0])

    @classmethod
    def of_topic(cls, topic: str) -> "Lab":
        return cls(topic.split(".", 1)[0])


def local_group(group_id: str) -> str:
    """``default.payments`` → ``payments``: a group id as the lab's own pages name it."""
    return Lab.of_group_id(group_id).local_group(group_id) if "." in group_id else group_id
