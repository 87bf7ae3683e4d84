"""The external side effect: a group's notification setting, and what was sent and
received per account (the Notifications panel's data, as JSON)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..domain.vocabulary import NOTIFY_MODES
from ..readmodel import notifications as readmodel
from ..store import schema
from .groups import GroupRef, _group_settings, _update_group
from .registry import Context, InvalidRequest, NoArgs, operation


class NotificationArgs(GroupRef):
    notify: Literal[NOTIFY_MODES] = Field(description="off; before-commit: call the notification service inside "
                                          "the effect's transaction, before its commit; after-commit: after it, "
                                          "before the offset commit. Applied credits only")
    idempotency_key: bool = Field(False, description="send the event id as the Idempotency-Key header, which the "
                                  "service honours: a repeated key gets the first response, no new notification")


@operation("set_notification", settles=True, path="/groups/<group>/notification", step="notification", cli="notification",
           tags=("groups", "notifications"),
           summary="Make a group's consumers notify the customer of each applied credit (before or after the "
                   "database commit), with or without an Idempotency-Key")
def set_notification(ctx: Context, args: NotificationArgs) -> dict:
    if args.notify != "off" and _group_settings(ctx, args.group).batch_size > 1:
        raise InvalidRequest("notify", f"group {args.group} runs in batch mode, which does not call the notification "
                             "service: set batch_size 1 (per-message mode) first")
    how = ("no notifications" if args.notify == "off" else
           f"notify {args.notify} " + ("with Idempotency-Key: <event_id>" if args.idempotency_key
                                       else "without an Idempotency-Key"))
    group_id = _update_group(ctx, args.group, f"{{group_id}}: {how} (from the next message)",
                             notify=args.notify, notify_idempotency_key=args.idempotency_key)
    return {"group_id": group_id, "notify": args.notify, "idempotency_key": args.idempotency_key}


@operation("get_notifications", method="GET", path="/notifications", cli="notifications",
           tags=("notifications",),
           summary="Per account: notifications sent by the consumers, received and delivered by the notification "
                   "service (its own table), duplicates the customer got, replays the key absorbed; each group's "
                   "setting")
def get_notifications(ctx: Context, args: NoArgs) -> dict:
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        return {"groups": readmodel.group_settings(conn), "accounts": readmodel.accounts(conn),
                "duplicates": [{key: value for key, value in item.items() if key != "sends"}
                               for item in readmodel.duplicates(conn)]}
