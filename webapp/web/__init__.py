"""The web layer: one blueprint per feature area. Web processes read PostgreSQL and write
commands; they hold no Kafka client."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from flask import Flask, current_app
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from .db import lab_session
from ..domain.lab import local_group
from ..store.labs import Lab


def current_lab() -> Lab:
    """The lab this request works in: in classroom mode the session's own lab (or the one it views
    read-only, see classroom.request_lab), else LAB_NAME. Every blueprint resolves it here."""
    from .classroom import request_lab
    return request_lab()


@contextmanager
def lab_db() -> Iterator[tuple[Lab, Session]]:
    """The current lab and a session working in its schema."""
    lab = current_lab()
    with lab_session(lab.schema) as session:
        yield lab, session


def register_blueprints(app: Flask) -> None:
    from . import api, auth, classroom, controls, dashboard, health, scenarios

    app.register_blueprint(dashboard.bp)
    app.register_blueprint(controls.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(auth.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(scenarios.bp)
    classroom.init_app(app)
    from .security import csrf
    csrf.exempt(api.bp)
    register_error_pages(app)
    app.add_template_filter(local_group)


def register_error_pages(app: Flask) -> None:
    """Plain, readable error pages; the API blueprint answers JSON itself."""
    from flask import jsonify, render_template, request

    def page(code: int, message: str):
        if request.path.startswith("/api/"):
            return jsonify(error=message), code
        return render_template("errors/error.html", code=code, message=message), code

    app.register_error_handler(404, lambda e: page(404, f"There is nothing at {request.path}."))
    app.register_error_handler(405, lambda e: page(405, f"{request.method} is not allowed here."))
    app.register_error_handler(500, lambda e: page(500, "Something broke in the lab; the server log says what."))
    app.register_error_handler(SQLAlchemyError, lambda e: page(503, database_trouble(e)))


def database_trouble(error: Exception) -> str:
    """Why the lab's database cannot serve this request, in one sentence (the answer is a 503)."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    current_app.logger.warning("database error: %s", error)
    if isinstance(error, ProgrammingError) and "does not exist" in str(error):
        return ("The lab is not set up in this database yet: run `flask --app app lab init` "
                "(`make run` does it for you).")
    if isinstance(error, OperationalError):
        return "The lab's database does not answer right now; the lab recovers by itself once it is back."
    return f"The lab's database refused this request ({type(error).__name__}); the server log says why."
