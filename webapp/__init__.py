"""Idempotency Lab: a dashboard and event-replay simulator for at-least-once messaging.

This level holds ``create_app()`` and nothing else; the rooms are the packages beside it (see the
architecture page). Flask is imported inside ``create_app``: the consumers and the agent import
``webapp.*`` too, and never load Flask.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from flask import Flask

NO_DATABASE = ("DATABASE_URL is not set and no running lab was found in LAB_DATA_DIR. "
               "Start the lab with `make run` (embedded PostgreSQL and broker), or set DATABASE_URL.")


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the web app: settings from defaults, then environment/.env, then ``test_config``."""
    from flask import Flask

    from .settings import load_config

    app = Flask(__name__, template_folder="../templates", static_folder="../static")
    app.config.from_mapping(load_config(overrides=test_config))
    if not app.config.get("DATABASE_URL"):
        # The `flask` CLI still gets its commands (`scenario list` needs no lab); the web does not start.
        app.config["NO_DATABASE"] = NO_DATABASE
        if os.environ.get("FLASK_RUN_FROM_CLI") != "true":
            raise RuntimeError(NO_DATABASE)

    from . import cli
    from .web import access, db, record_operations, register_blueprints, security

    if not app.config.get("NO_DATABASE"):
        db.init_app(app)
    security.init_app(app, may_post_without_token=access.attendee_may_post)
    register_blueprints(app)
    cli.init_app(app)
    record_operations()
    return app
