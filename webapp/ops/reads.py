"""What the lab looks like now, as one document: the same read model as the panels."""
from __future__ import annotations

from pydantic import Field

from ..readmodel import accounts, verdict
from ..readmodel.consumers import consumers
from ..readmodel.group_health import group_health
from ..readmodel.groups import effects_schemas, groups_list
from ..readmodel.partitions import partitions
from ..readmodel.producer_duplicates import producer_duplicates
from ..readmodel.service_health import service_health
from ..store.schema import enter, session_in
from .lab import get_ttl
from .registry import Args, Context, NoArgs, operation

CONSUMER_KEYS = ("id", "name", "group_id", "strategy", "state", "pid", "assigned", "positions", "applied_positions",
                 "generation", "applied", "absorbed", "dead_lettered", "commit_failures", "armed_point",
                 "armed_action", "armed_always", "step_mode", "step_at", "redelivery_window", "heartbeat_age",
                 "waiting_on", "last_error", "exit_code")


def consumer_json(row: dict) -> dict:
    return {key: row.get(key) for key in CONSUMER_KEYS}


class StateArgs(Args):
    exact: bool = Field(False, description="judge the accounts and the verdict from the whole log and every "
                                           "effect (VERDICT_SQL), not from the running summaries: the same "
                                           "answer, seconds at millions of records")


@operation("get_state", method="GET", path="/state", cli="state", tags=("state",),
           summary="Accounts (actual, expected, difference), verdict, groups, consumers, partitions, TTL, "
                   "and each strategy lane's accounts and verdict")
def get_state(ctx: Context, args: StateArgs) -> dict:
    lab = ctx.lab
    # One snapshot for the whole answer: read committed would let the accounts and the verdict each
    # see a different moment (a record the log reader mirrors in between), and contradict each other.
    with session_in(ctx.engine.execution_options(isolation_level="REPEATABLE READ"), lab.schema) as session:
        health = group_health(session, lab)
        return {
            "lab": lab.name, "topic": lab.topic,
            "accounts": [{**line.__dict__, "difference": line.difference}
                         for line in accounts.accounts(session, lab.schema, exact=args.exact)],
            "verdict": verdict.verdict(session, lab.schema, exact=args.exact).as_dict(),
            "producer_duplicates": producer_duplicates(session, lab, exact=args.exact),
            # Each group with its health (readmodel/group_health.py): stable, rebalancing, stalled,
            # recovering or empty, and the sentence the status bar shows.
            "groups": [{**group, "health": health.get(group["group_id"])} for group in groups_list(session)],
            "consumers": [consumer_json(c) for c in consumers(session, lab)],
            "partitions": [{"partition": p.partition, "log_end": p.log_end, "committed": p.committed,
                            "positions": p.positions,
                            # records of the strip that landed after a later one of their producer
                            "out_of_order": [{"offset": offset, "why": why}
                                             for offset, why in sorted(p.out_of_order.items())]}
                           for p in partitions(session, lab, cells=False)],
            "ttl": get_ttl(ctx, NoArgs()),
            "lanes": lane_states(session, lab, exact=args.exact),
            # The parts the lab depends on (readmodel/service_health.py): each up (true), down
            # (false, with the status bar's sentence and what to do) or unknown (null).
            "services": service_health(session, lab),
        }


@operation("list_consumers", method="GET", path="/consumers", cli="consumers", tags=("consumers",),
           summary="The lab's consumers as they last reported (the consumers panel), without the rest of "
                   "the state: a cheap read to poll")
def list_consumers(ctx: Context, args: NoArgs) -> dict:
    with session_in(ctx.engine, ctx.lab.schema) as session:
        return {"consumers": [consumer_json(c) for c in consumers(session, ctx.lab)]}


def lane_states(session, lab, exact: bool = False) -> list[dict]:
    """Each strategy lane's own copy of the accounts, judged against the same log."""
    groups = groups_list(session)
    lanes = []
    for lane_schema in effects_schemas(session, lab):
        if lane_schema == lab.schema:
            continue
        enter(session.connection(), lane_schema)
        lanes.append({
            "lane": lab.lane_of(lane_schema), "schema": lane_schema,
            "groups": [{"group_id": g["group_id"], "strategy": g["strategy"]} for g in groups
                       if g["effects_schema"] == lane_schema],
            "accounts": [{**line.__dict__, "difference": line.difference}
                         for line in verdict.accounts(session, lab.schema, exact=exact)],
            "verdict": verdict.verdict(session, lab.schema, exact=exact).as_dict()})
    enter(session.connection(), lab.schema)
    return lanes
