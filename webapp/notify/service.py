"""The notification service's HTTP app and its statements (see the package docstring).

A tiny Flask app: ``POST /notifications`` and ``GET /health``. Bad input answers 400 with the
field (``{"error", "field"}``, as the lab's API does), an unknown lab 404, a key reused with
another body 422, a database that does not answer 503; never a 500 for anything a caller sends.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from flask import Flask, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from ..domain.events import ACCOUNT_ID
from ..domain.lab import NAME, Lab
from ..domain.vocabulary import Limits
from ..store.connection import sqlalchemy_url
from ..store.schema import enter
from .protocol import KEY_HEADER, KEY_LENGTH, PATH, REPLAYED_HEADER, TEXT_LENGTH

# The statements, literal: the Notifications panel shows them as the service's side of the lesson.
DELIVER = ("INSERT INTO notifications (account_id, event_id, amount_cents, text, idempotency_key)\n"
           "VALUES (%(account_id)s, %(event_id)s, %(amount_cents)s, %(text)s, %(key)s)\n"
           "RETURNING id, received_at")
# The key first, with a placeholder response: a concurrent request with the same key waits here
# until this transaction ends, then finds the key (and the response stored below) and replays it.
CLAIM_KEY = ("INSERT INTO idempotency_keys (key, request_hash, status, body)\n"
             "VALUES (%(key)s, %(request_hash)s, 0, '{}')\n"
             "ON CONFLICT (key) DO NOTHING")
STORE_RESPONSE = "UPDATE idempotency_keys SET status = %(status)s, body = %(body)s::jsonb WHERE key = %(key)s"
# 0 rows: the key was first used with another request (422), nothing is delivered or counted.
REPLAY = ("UPDATE idempotency_keys SET replays = replays + 1\n"
          "WHERE key = %(key)s AND request_hash = %(request_hash)s\n"
          "RETURNING status, body")
RECORD_REPLAY = ("INSERT INTO notifications (account_id, event_id, amount_cents, text, idempotency_key, replayed)\n"
                 "VALUES (%(account_id)s, %(event_id)s, %(amount_cents)s, %(text)s, %(key)s, true)")
LAB_EXISTS = "SELECT 1 FROM pg_tables WHERE schemaname = :schema AND tablename = 'notifications'"
CREATED = 201


class NotificationRequest(BaseModel):
    """The body of ``POST /notifications``."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    lab: str = Field(pattern=NAME.pattern, description="the lab whose customer is notified")
    account_id: str = Field(pattern=ACCOUNT_ID.pattern, description="the customer's account, like acc-1")
    event_id: str = Field(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
                          description="the payment event the message is about (a UUID)")
    amount_cents: int = Field(ge=Limits.AMOUNT_CENTS[0], le=Limits.AMOUNT_CENTS[1], description="the credit, in cents")
    text: str = Field(min_length=TEXT_LENGTH[0], max_length=TEXT_LENGTH[1], description="the message")

    def request_hash(self) -> str:
        """The request's fingerprint: a key reused with a different request is refused."""
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()


class NoSuchLab(LookupError):
    pass


class KeyReused(ValueError):
    pass


def receive(engine: Engine, notice: NotificationRequest, key: str | None) -> tuple[int, dict[str, Any], bool]:
    """Deliver one notification or replay the first response to its key: (status, body, replayed)."""
    schema = Lab(notice.lab).schema
    params = {**notice.model_dump(exclude={"lab"}), "key": key, "request_hash": notice.request_hash()}
    with engine.begin() as conn:
        if conn.execute(text(LAB_EXISTS), {"schema": schema}).first() is None:
            raise NoSuchLab(f"no lab {notice.lab!r} in this database")
        enter(conn, schema)
        if key is None:
            return CREATED, _deliver(conn, notice, params), False
        if conn.exec_driver_sql(CLAIM_KEY, params).rowcount == 1:
            body = _deliver(conn, notice, params)
            conn.exec_driver_sql(STORE_RESPONSE, {"key": key, "status": CREATED, "body": json.dumps(body)})
            return CREATED, body, False
        first = conn.exec_driver_sql(REPLAY, params).first()
        if first is None:
            raise KeyReused(f"{KEY_HEADER} {key!r} was first used with a different request")
        conn.exec_driver_sql(RECORD_REPLAY, params)
        return first.status, first.body, True


def _deliver(conn: Connection, notice: NotificationRequest, params: dict[str, Any]) -> dict[str, Any]:
    row = conn.exec_driver_sql(DELIVER, params).one()
    return {"notification_id": row.id, "delivered_at": row.received_at.isoformat(), **notice.model_dump()}


def _invalid(field: str, message: str, status: int = 400):
    return jsonify(error=f"{field}: {message}", field=field), status


def _first_error(error: ValidationError) -> tuple[str, str]:
    first = error.errors(include_url=False)[0]
    loc = [str(part) for part in first.get("loc", ())]
    field = loc[0] if loc else "body"
    kind = first.get("type", "")
    if kind == "missing":
        return field, "is required"
    if kind == "extra_forbidden":
        return field, "is not a field of a notification (lab, account_id, event_id, amount_cents, text)"
    return field, str(first.get("msg", "is not valid"))


def create_service(database_url: str, engine: Engine | None = None) -> Flask:
    """The service's app over ``database_url`` (its own small connection pool)."""
    app = Flask("webapp.notify")
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024
    engine = engine or create_engine(sqlalchemy_url(database_url), pool_size=4, max_overflow=4, pool_pre_ping=True,
                                     connect_args={"connect_timeout": 3})
    app.extensions["notify_engine"] = engine

    @app.post(PATH)
    def notify():
        body = request.get_json(force=True, silent=True)
        if not isinstance(body, dict):
            return _invalid("body", "must be a JSON object")
        try:
            notice = NotificationRequest.model_validate(body)
        except ValidationError as error:
            return _invalid(*_first_error(error))
        key = request.headers.get(KEY_HEADER)
        if key is not None and not (KEY_LENGTH[0] <= len(key) <= KEY_LENGTH[1]):
            return _invalid(KEY_HEADER, f"must be {KEY_LENGTH[0]}-{KEY_LENGTH[1]} characters")
        try:
            status, answer, replayed = receive(engine, notice, key)
        except NoSuchLab as error:
            return _invalid("lab", str(error), 404)
        except KeyReused as error:
            return _invalid(KEY_HEADER, str(error), 422)
        except OperationalError as error:
            app.logger.warning("database unavailable: %s", error)
            return jsonify(error="the notification service's database does not answer"), 503
        except SQLAlchemyError as error:
            app.logger.warning("database error: %s", error)
            return jsonify(error=f"the notification service could not store it ({type(error).__name__})"), 503
        response = jsonify(answer)
        response.status_code = status
        if replayed:
            response.headers[REPLAYED_HEADER] = "true"
        return response

    @app.get("/health")
    def health():
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as error:
            return jsonify(ok=False, error=str(error).splitlines()[0]), 503
        return jsonify(ok=True)

    return app
