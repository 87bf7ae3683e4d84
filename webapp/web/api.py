"""The JSON API under /api/v1: one route per operation of the registry, and its OpenAPI document.

Errors are JSON: 400 ``{"error", "field"}`` for bad input, 409 when the lab is busy with a job that
must finish first (a load or a dedup warm-up), 404 for unknown ids, 503 when no lab
agent (or fault proxy) runs. State-changing requests must be ``application/json`` (see
security.py).
"""
from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, current_app, jsonify, render_template, request
from markupsafe import Markup, escape

from .. import ops
from .access import current_lab
from .db import db
from .openapi import openapi_document

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def ops_context() -> ops.Context:
    return ops.Context(db.engine, current_lab(), current_app.config)


def json_body() -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise ops.InvalidRequest("body", "send Content-Type: application/json")
    body = request.get_json(silent=True)
    if body is None and request.content_length:
        raise ops.InvalidRequest("body", "is not valid JSON")
    if body is not None and not isinstance(body, dict):
        raise ops.InvalidRequest("body", "must be a JSON object")
    return body or {}


def error_response(error: Exception):
    """The JSON answer for an operation's error, or None for an error that is not one of them."""
    if isinstance(error, ops.Busy):
        return jsonify(error=error.message, field=error.field), 409
    if isinstance(error, ops.InvalidRequest):
        return jsonify(error=error.message, field=error.field), 400
    if isinstance(error, ops.NotFound):
        return jsonify(error=str(error)), 404
    if isinstance(error, ops.NoAgent):
        return jsonify(error=str(error)), 503
    return None


def operation_view(op: ops.Operation):
    def view(**path_args: Any):
        try:
            # A change takes a JSON body; a read, its query string.
            body = json_body() if op.changes_state else request.args.to_dict()
            # The path names the consumer or group; a body cannot redirect the call elsewhere.
            result = ops.call(op.name, ops_context(), {**body, **path_args})
        except (ops.InvalidRequest, ops.NotFound, ops.NoAgent) as error:
            return error_response(error)
        return jsonify(result), op.status
    view.__name__ = op.name
    view.__doc__ = op.summary
    return view


for _op in ops.OPERATIONS.values():
    bp.add_url_rule(_op.path, endpoint=_op.name, view_func=operation_view(_op), methods=[_op.method])


@bp.app_template_filter("code_spans")
def code_spans(text: str | None) -> Markup:
    """Backticked words of a description as <code>, the rest escaped."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text or ""))))


@bp.get("/openapi.json")
def openapi():
    return jsonify(openapi_document())


@bp.get("/docs")
def docs():
    """The API, readable: rendered on the server from the same OpenAPI document."""
    return render_template("api/docs.html", doc=openapi_document())
