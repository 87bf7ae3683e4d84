"""The web layer: one blueprint per feature area, the request's lab (access.py), security, markdown.
May import scenarios, ops, readmodel, strategies, store and domain; never kafka, consumer or agent."""
from __future__ import annotations

from flask import Flask, current_app
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import local_group
from .access import current_lab, lab_db  # noqa: F401  (the request's lab, for every blueprint: access.py)


def register_blueprints(app: Flask) -> None:
    from flask import request

    from . import api, auth, classroom, controls, dashboard, docs, fairshare, health, push, scenarios

    app.register_blueprint(dashboard.bp)
    app.register_blueprint(controls.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(auth.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(scenarios.bp)
    app.register_blueprint(docs.bp)
    app.register_blueprint(push.bp)
    # A lab's share of the pool is taken first: the classroom's own checks read the database too.
    fairshare.init_app(app, lambda: current_lab().name,
                       lambda: request.blueprint in classroom.LAB_BLUEPRINTS or request.endpoint in classroom.LAB_ENDPOINTS)
    classroom.init_app(app)
    from .security import csrf
    csrf.exempt(api.bp)
    register_error_pages(app)
    app.add_template_filter(local_group)


def record_operations() -> None:
    """Record every state-changing operation this app runs (forms, API, ``flask lab``) in its lab's
    session log: the scenarios' journal, as a hook of the operation registry (once per process)."""
    from ..scenarios import journal
    journal.install()


def register_error_pages(app: Flask) -> None:
    """Plain, readable error pages; the API blueprint answers JSON itself."""
    from flask import jsonify, render_template, request

    def page(code: int, message: str):
        if request.path.startswith("/api/"):
            return jsonify(error=message), code
        return render_template("errors/error.html", code=code, message=message), code

    app.register_error_handler(404, lambda e: page(404, f"There is nothing at {request.path}."))
    app.register_error_handler(405, lambda e: page(405, f"{request.method} is not allowed here."))
    app.register_error_handler(413, lambda e: page(413, (
        f"This request's body is larger than this lab accepts ({app.config['MAX_CONTENT_LENGTH']:,} bytes, "
        "MAX_CONTENT_LENGTH): send less.")))
    app.register_error_handler(500, lambda e: page(500, "Something broke in the lab; the server log says what."))

    def database_unavailable(error: SQLAlchemyError):
        """503 with the reason; the API's answer also says which parts are down, as the status bar does."""
        from sqlalchemy.exc import OperationalError
        if request.path.startswith("/api/") and isinstance(error, OperationalError):
            from ..readmodel.service_health import database_unreachable, driver_error
            return jsonify(error=database_trouble(error), services=database_unreachable(driver_error(error))), 503
        return page(503, database_trouble(error))
    app.register_error_handler(SQLAlchemyError, database_unavailable)


def database_trouble(error: Exception) -> str:
    """Why the lab's database cannot serve this request, in one sentence (the answer is a 503)."""
    import psycopg
    from sqlalchemy.exc import OperationalError, ProgrammingError

    current_app.logger.warning("database error: %s", error)
    cause = getattr(error, "orig", None)
    if isinstance(cause, psycopg.errors.LockNotAvailable):
        return ("A session holds a lock on this lab's tables (your own consumer's open transaction?): the lab's read "
                "gave up rather than wait. End that transaction, or Your consumer → Terminate its sessions.")
    if isinstance(cause, psycopg.errors.QueryCanceled):
        return "This read of the lab took longer than the lab lets one take (its statement timeout): try again."
    if isinstance(error, ProgrammingError) and "does not exist" in str(error):
        return ("The lab is not set up in this database yet: run `flask --app app lab init` "
                "(`make run` does it for you).")
    if isinstance(error, OperationalError):
        return "The lab's database does not answer right now; the lab recovers by itself once it is back."
    return f"The lab's database refused this request ({type(error).__name__}); the server log says why."
