"""Settings: one typed model (settings/model.py, pydantic-settings) read from a ``.env`` file, then
the environment, then a test dict; ``load_config`` turns it into the dict every process reads.
Imports nothing of the project; web, cli, agent, launcher and sidecars read it.

``load_config`` is pure apart from reading the environment and the data dir, so the rules
(loopback unless a token is set, a SECRET_KEY kept across restarts, classroom defaults) are
tested directly. ``python -m webapp.settings`` prints the table of every setting.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from .model import ConfigError, LabSettings, is_loopback, load_settings, read_secret, with_password
from .reference import reference_markdown

__all__ = ["DEFAULTS", "RUNNING_FILE", "ConfigError", "LabSettings", "is_loopback",
           "auto_recover_groups", "database_url", "environment_settings", "load_config", "reference_markdown", "running_services"]

# Each setting's default outside classroom mode, from the model (tests and the deploy checks read it).
DEFAULTS: dict[str, Any] = {name: field.default for name, field in LabSettings.model_fields.items()}


RUNNING_FILE = "running.json"


def running_services(data_dir: Path) -> dict[str, str]:
    """The service addresses a running `make run` wrote, so a second terminal's CLI finds them."""
    path = data_dir / RUNNING_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _secret_key(data_dir: Path) -> str:
    """The SECRET_KEY kept in the data dir, generated on first use."""
    path = data_dir / "secret_key"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    path.write_text(key)
    path.chmod(0o600)
    return key


def load_config(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None,
                env_file: str | os.PathLike | None = ".env") -> dict[str, Any]:
    """Every setting: defaults, then ``env_file``, then ``environ`` (None: os.environ), then
    ``overrides`` (a test dict; its keys that are not settings, Flask's ``TESTING`` say, pass through).
    Then the rules no single value holds: a running lab's addresses, the producer's bootstrap
    servers, the SECRET_KEY kept in the data dir. A value that does not fit raises ConfigError."""
    overrides = dict(overrides or {})
    fields = LabSettings.model_fields
    settings = load_settings(environ, {k: v for k, v in overrides.items() if k in fields},
                             env_file if env_file and Path(env_file).exists() else None)
    config: dict[str, Any] = {**settings.model_dump(), **{k: v for k, v in overrides.items() if k not in fields}}

    data_dir = Path(config["LAB_DATA_DIR"]).resolve()
    config["LAB_DATA_DIR"] = str(data_dir)
    running = running_services(data_dir)
    for key in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_PRODUCER_BOOTSTRAP_SERVERS",
                "KAFKA_LEARNER_BOOTSTRAP_SERVERS"):
        if not config.get(key) and running.get(key):
            config[key] = running[key]
            if key == "DATABASE_URL" and running.get("DATABASE_PASSWORD_FILE"):
                try:
                    config[key] = with_password(config[key], read_secret("DATABASE_PASSWORD_FILE",
                                                                         running["DATABASE_PASSWORD_FILE"]))
                except ValueError as problem:
                    raise ConfigError(str(problem)) from None
    config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] = (
        config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] or config["KAFKA_BOOTSTRAP_SERVERS"])
    if not config["SECRET_KEY"]:
        config["SECRET_KEY"] = _secret_key(data_dir)
    return config


def environment_settings(environ: Mapping[str, str] | None = None) -> LabSettings:
    """The settings model from the environment alone (None: os.environ), without ``.env`` or a
    running lab's addresses: for the processes the agent starts, whose settings it put in their
    environment. A value that does not fit raises ConfigError."""
    return load_settings(environ, {}, None)


def database_url(environ: Mapping[str, str] | None = None) -> str | None:
    """DATABASE_URL as the environment (None: os.environ) gives it, with DATABASE_PASSWORD_FILE's
    password put in, as load_config does: for the sidecars and healthchecks that read no other setting."""
    environ = os.environ if environ is None else environ
    url = environ.get("DATABASE_URL") or None
    path = environ.get("DATABASE_PASSWORD_FILE")
    if not path:
        return url
    try:
        return with_password(url, read_secret("DATABASE_PASSWORD_FILE", path))
    except ValueError as problem:
        raise ConfigError(str(problem)) from None


def auto_recover_groups(config: Mapping[str, Any]) -> bool:
    """Whether the agent recovers stalled groups by itself (LAB_AUTO_RECOVER_GROUPS; its classroom
    default, on, is applied by the model)."""
    return bool(config.get("LAB_AUTO_RECOVER_GROUPS"))
