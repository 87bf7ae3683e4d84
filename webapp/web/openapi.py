"""OpenAPI 3.1 from the operation registry: one path per operation, its body schema from the
operation's pydantic model, its answers (success, 400, 404, 503) as the API gives them."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from .. import ops

REF = "#/components/schemas/{model}"
ERROR = {"$ref": "#/components/schemas/Error"}
PATH_PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")


def _path(flask_path: str) -> str:
    return PATH_PARAM.sub(lambda m: "{" + m.group(2) + "}", flask_path)


def _answer(description: str, schema: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(op: ops.Operation, components: dict[str, Any]) -> dict[str, Any]:
    schema = op.model.model_json_schema(ref_template=REF)
    components.update(schema.pop("$defs", {}))
    properties = schema.get("properties", {})
    parameters = [{"name": name, "in": "path", "required": True, "schema": properties.pop(name)}
                  for name in op.path_params]
    if not op.changes_state:  # a read's arguments are its query string
        parameters += [{"name": name, "in": "query", "required": False, "schema": properties.pop(name)}
                       for name in list(properties)]
    schema["required"] = [name for name in schema.get("required", []) if name not in op.path_params]
    if not schema["required"]:
        schema.pop("required")
    spec: dict[str, Any] = {
        "operationId": op.name, "summary": op.summary, "tags": list(op.tags) or ["lab"],
        "responses": {str(op.status): _answer("done", {"type": "object"}),
                      "400": _answer("bad input: `field` names what to fix", ERROR),
                      "404": _answer("no such consumer, group or resource", ERROR),
                      "503": _answer("no lab agent (or fault proxy) is running, none finished the request in time, or "
                                     "the database is down", ERROR)},
    }
    if op.name in ops.scale.HEAVY_JOBS:
        spec["responses"]["409"] = _answer("the lab runs a heavy job already (a load or a dedup warm-up): the "
                                           "error says which and how to stop it", ERROR)
    if op.name == "explore":
        spec["responses"]["409"] = _answer("the lab runs an exploration already (one at a time per lab; the error "
                                           "says which and how to cancel it), or the server holds as many labs as "
                                           "it allows (LAB_MAX_LABS): each run against a strategy needs one of its own", ERROR)
    if op.step:
        spec["x-scenario-step"] = op.step
    if parameters:
        spec["parameters"] = parameters
    if op.changes_state:
        name = op.model.__name__
        components[name] = schema
        spec["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=name)}}}}
        spec["responses"]["401"] = _answer("LAB_TOKEN is set: send Authorization: Bearer <token>", ERROR)
    return spec


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    components: dict[str, Any] = {"Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "string", "description": "what went wrong, for a person"},
                       "field": {"type": "string", "description": "the field to fix (bad input only)"}}}}
    paths: dict[str, dict[str, Any]] = {}
    for op in ops.OPERATIONS.values():
        paths.setdefault(_path(op.path), {})[op.method.lower()] = _operation(op, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Idempotency Lab API", "version": "1",
                 "description": "Every control of the lab. Each operation is also a dashboard form, a "
                                "`flask lab` command and (where `x-scenario-step` says) a scenario step."},
        "servers": [{"url": "/api/v1"}],
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"labToken": {"type": "http", "scheme": "bearer",
                                                        "description": "only when the lab runs with LAB_TOKEN"}}},
    }
