"""Your consumer: a lane whose consumer is the learner's own code, outside the lab.

The lab creates the lane (its copy of the accounts and a ``payments`` table), a consumer group for
it and a PostgreSQL role that may touch that lane's tables only; it shows where to connect, judges
what the code wrote against the log like any lane, and applies the faults it can to code it does
not run: the outside consumer's broker connections cut and its offset commits kept from the broker
(both at the fault proxy, by its Kafka client id), and its database sessions terminated. Resends,
source duplicates and lost acks are the lab's producer's (publish, lost_ack), as for every lane.
"""
from __future__ import annotations

from pydantic import Field
from sqlalchemy.engine import make_url

from ..domain import commands, verbs
from ..domain.lab import NAME_RULE, InvalidLabName
from ..domain.vocabulary import (
    DEFAULT_OUTSIDE_LANE,
    FAULT_PROXY_FRESH_SECONDS,
    OUTSIDE_STRATEGY,
    SCRAM_LEARNERS,
    Limits,
)
from ..domain.waits import WaitTimeout
from ..faultproxy.control import DEFAULT_NAME
from ..store import faultproxies, labdata, outside, schema
from ..store.connection import sqlalchemy_url
from ..store.labs import ensure_schema, seed_accounts
from .agent_commands import run_command
from .faults import NO_PROXY_RUNNING, NoFaultProxy, _set_commit_block
from .fields import Whole, named, within
from .limits import check_lanes
from .registry import Args, Context, InvalidRequest, NotFound, operation

# What the learner's code writes: one row per credit it applied (the lab's own strategies write the
# same table). The verdict counts these rows per transaction id against the log.
PAYMENTS_SHAPE = ("payments (id bigserial, event_id uuid, transaction_id varchar(64), account_id varchar(32) "
                  "references accounts, amount_cents bigint, applied_at timestamp default now())")


class LaneArgs(Args):
    lane: str = named("your consumer's lane (and group) name", default=DEFAULT_OUTSIDE_LANE)


class CommitBlockArgs(LaneArgs):
    blocked: bool = Field(True, description="true: your consumer's offset commits stop reaching the broker; "
                          "false: they get through again")
    seconds: Whole = within(Limits.BLOCKED_COMMITS_SECONDS, "how long the block lasts, at most", default=60,
                            unit=" s")


def _checked_lane(ctx: Context, lane: str) -> tuple[str, str]:
    """(schema, group id) of ``lane``, or InvalidRequest naming the field."""
    try:
        return ctx.lab.lane_schema(lane), ctx.lab.group_id(lane)
    except InvalidLabName:
        raise InvalidRequest("lane", NAME_RULE) from None


def _credentials(ctx: Context, lane: str) -> outside.LaneCredentials:
    """The lane's credentials; new ones (set on its role) when none this SECRET_KEY can read are kept:
    a lane made before they were kept encrypted, or under another SECRET_KEY."""
    secret_key = ctx.config["SECRET_KEY"]
    with ctx.engine.connect() as conn:
        found = outside.credentials_of(conn, secret_key, ctx.lab.lane_role(lane))
    if found is not None:
        return found
    with ctx.engine.begin() as conn:
        issued = outside.grant_lane(conn, ctx.lab, lane, secret_key, ctx.config["LAB_LANE_CONNECTION_LIMIT"])
    _grant_on_kafka(ctx, lane)
    return issued


def _grant_on_kafka(ctx: Context, lane: str) -> None:
    """On Apache Kafka's SCRAM listener for learners, an agent makes (or refreshes) the lane's SCRAM
    user and ACLs; the embedded broker's gateway reads the lane's principal from PostgreSQL itself."""
    if ctx.config.get("KAFKA_LEARNER_SASL_MECHANISM") == SCRAM_LEARNERS:
        run_command(ctx, verbs.LANE_KAFKA_PRINCIPAL, commands.LanePrincipal(lane=lane), field="lane")


def _kafka_access(ctx: Context, role: str, password: str) -> dict:
    """Where and how the learner's Kafka client signs in: the learners' listener (the lab's Kafka
    gateway on the embedded broker, Apache Kafka's SASL listener in compose) with the lane's user."""
    learners = ctx.config.get("KAFKA_LEARNER_BOOTSTRAP_SERVERS")
    if not learners:
        return {"kafka_authenticated": False}
    return {"kafka_authenticated": True, "learner_bootstrap_servers": learners, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": ctx.config.get("KAFKA_LEARNER_SASL_MECHANISM") or "PLAIN", "sasl_username": role,
            "sasl_password": password}


def connection(ctx: Context, lane: str, issued: outside.LaneCredentials | None = None) -> dict:
    """What the learner's code connects to: the broker (the learners' listener, with the lane's Kafka
    user, when there is one), the topic, the group and client ids, and the database URL of the lane's role."""
    lab = ctx.lab
    role = lab.lane_role(lane)
    issued = issued or _credentials(ctx, lane)
    proxy = ctx.config.get("KAFKA_PRODUCER_BOOTSTRAP_SERVERS")
    broker = ctx.config.get("KAFKA_BOOTSTRAP_SERVERS") or ""
    database = ctx.config.get("DATABASE_URL")
    url = (make_url(sqlalchemy_url(database)).set(drivername="postgresql", username=role,
                                                  password=issued.database_password)
           .render_as_string(hide_password=False)) if database else None
    kafka = _kafka_access(ctx, role, issued.kafka_password)
    return {"lane": lane, "schema": lab.lane_schema(lane), "group_id": lab.group_id(lane), "topic": lab.topic,
            "client_id": lab.client_id(lane),
            "bootstrap_servers": kafka.get("learner_bootstrap_servers") or proxy or broker,
            "through_fault_proxy": bool(proxy and proxy != broker), "role": role, "database_url": url,
            "connection_limit": ctx.config["LAB_LANE_CONNECTION_LIMIT"], "payments_shape": PAYMENTS_SHAPE, **kafka}


def _outside_group(ctx: Context, lane: str) -> str:
    """The lane's group id; NotFound when the lab has no outside lane of that name."""
    _, group_id = _checked_lane(ctx, lane)
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        row = labdata.group(conn, group_id)
    if row is None or row.strategy != OUTSIDE_STRATEGY:
        raise NotFound(f"lab {ctx.lab.name} has no lane {lane} for your consumer: create it first (POST /yours)")
    return group_id


@operation("create_yours", path="/yours", status=201, step="yours", cli="yours", tags=("yours",),
           summary="Your consumer: a lane of its own (accounts, payments), a consumer group and a PostgreSQL role "
                   "that may touch that lane only; returns where your code connects")
def create_yours(ctx: Context, args: LaneArgs) -> dict:
    lab = ctx.lab
    lane_schema, group_id = _checked_lane(ctx, args.lane)
    with ctx.engine.begin() as conn:
        schema.enter(conn, lab.schema)
        existing = labdata.group(conn, group_id)
        if existing is not None and existing.strategy != OUTSIDE_STRATEGY:
            raise InvalidRequest("lane", f"group {group_id} exists already, with the lab's strategy "
                                 f"{existing.strategy}: name your lane differently")
        check_lanes(ctx, outside.other_lanes(conn, lab, args.lane))
        ensure_schema(conn, lane_schema)
        seed_accounts(conn, lane_schema)
        issued = outside.grant_lane(conn, lab, args.lane, ctx.config["SECRET_KEY"],
                                    ctx.config["LAB_LANE_CONNECTION_LIMIT"])
        role = issued.role
        schema.enter(conn, lab.schema)
        if existing is None:
            labdata.add_group(conn, group_id, OUTSIDE_STRATEGY, lane_schema)
            labdata.say(conn, "strategy", f"lane {args.lane} for your consumer: group {group_id}, role {role} "
                        f"(it may touch {lane_schema} only)", group=group_id, lane=args.lane)
    _grant_on_kafka(ctx, args.lane)
    return connection(ctx, args.lane, issued)


@operation("get_yours", method="GET", path="/yours", tags=("yours",),
           summary="Where your consumer connects: bootstrap servers, topic, group id, client id, database URL")
def get_yours(ctx: Context, args: LaneArgs) -> dict:
    _outside_group(ctx, args.lane)
    with ctx.engine.connect() as conn:
        open_sessions = outside.sessions(conn, ctx.lab.lane_role(args.lane))
    return {**connection(ctx, args.lane), "database_sessions": open_sessions}


@operation("cut_yours", path="/yours/cut", step="cut_yours", cli="cut-yours", tags=("yours", "faults"),
           summary="Cut your consumer's broker connections at the fault proxy (by its client id): it reconnects, "
                   "and what it had not committed when the group moves on is delivered again")
def cut_yours(ctx: Context, args: LaneArgs) -> dict:
    _outside_group(ctx, args.lane)
    lab, client = ctx.lab, ctx.lab.client_id(args.lane)
    try:
        cut = faultproxies.cut_and_wait(ctx.engine, DEFAULT_NAME, lab.name, [client], FAULT_PROXY_FRESH_SECONDS)
    except WaitTimeout as error:
        raise NoFaultProxy(f"{error}; is it running?") from None
    if cut is None:
        raise NoFaultProxy(NO_PROXY_RUNNING)
    summary = (f"fault proxy cut {cut} broker connection(s) of your consumer ({client})" if cut else
               f"fault proxy found no broker connection of {client} to cut: is your consumer running, with "
               f"client.id {client}?")
    with schema.begin_in(ctx.engine, lab.schema) as conn:
        labdata.say(conn, "fault", summary, client=client, connections=cut)
    return {"client_id": client, "connections_cut": cut}


@operation("block_yours_commits", path="/yours/commits-blocked", step="block_yours_commits",
           cli="block-yours-commits", tags=("yours", "faults"),
           summary="Keep your consumer's offset commits from the broker at the fault proxy (its fetches flow); "
                   "blocked false lets them through again")
def block_yours_commits(ctx: Context, args: CommitBlockArgs) -> dict:
    _outside_group(ctx, args.lane)
    client = ctx.lab.client_id(args.lane)
    _set_commit_block(ctx, client, args.seconds if args.blocked else None)
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        if args.blocked:
            labdata.say(conn, "fault", f"fault proxy keeps your consumer's offset commits ({client}) from the broker "
                        f"for {args.seconds} s: the connection that carries one is closed first",
                        client=client, seconds=args.seconds)
        else:
            labdata.say(conn, "fault", f"fault proxy lets your consumer's offset commits ({client}) through again",
                        client=client)
    return {"client_id": client, "blocked": args.blocked, "seconds": args.seconds if args.blocked else 0}


@operation("terminate_yours", path="/yours/terminate-sessions", step="terminate_yours", cli="terminate-yours",
           tags=("yours", "faults"),
           summary="Terminate your consumer's database sessions (pg_terminate_backend of its role's sessions): "
                   "an open transaction rolls back")
def terminate_yours(ctx: Context, args: LaneArgs) -> dict:
    _outside_group(ctx, args.lane)
    role = ctx.lab.lane_role(args.lane)
    with ctx.engine.begin() as conn:
        ended = outside.terminate_sessions(conn, role)
        schema.enter(conn, ctx.lab.schema)
        labdata.say(conn, "fault", f"pg_terminate_backend ended {ended} database session(s) of your consumer "
                    f"(role {role}): an open transaction rolled back" if ended else
                    f"no database session of your consumer (role {role}) was open to terminate", role=role,
                    sessions=ended)
    return {"role": role, "sessions_terminated": ended}
