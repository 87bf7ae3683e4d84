"""Settings: defaults, then the environment (and a .env file), then a test dict.
Imports nothing of the project; web, cli, agent, launcher and sidecars read it.

``load_config`` is pure apart from reading the environment and the data dir, so the rules
(loopback unless a token is set, a SECRET_KEY kept across restarts) are tested directly.
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from dotenv import dotenv_values

DEFAULTS: dict[str, Any] = {
    "DATABASE_URL": None,
    "KAFKA_BOOTSTRAP_SERVERS": None,
    # Where the lab's producer reaches the broker; the fault proxy when one runs.
    "KAFKA_PRODUCER_BOOTSTRAP_SERVERS": None,
    "LAB_HOST": "127.0.0.1",
    "LAB_PORT": 5000,
    "LAB_DATA_DIR": ".lab",
    "LAB_NAME": "default",
    "LAB_PARTITIONS": 3,
    "LAB_TOKEN": None,
    # 1 when browsers reach the lab over HTTPS (a TLS proxy in front): the session cookie gets Secure.
    "LAB_HTTPS": 0,
    "SECRET_KEY": None,
    # How long the web waits for the lab agent to carry out a command.
    "LAB_COMMAND_TIMEOUT": 30.0,
    # Classroom mode (webapp/store/classroom.py): on with a class code or LAB_CLASSROOM=1; limits per lab.
    "LAB_CLASS_CODE": None,
    "LAB_CLASSROOM": 0,
    "LAB_CLASS_VIEW_OTHERS": 0,
    "LAB_MAX_LABS": 60,
    "LAB_MAX_CONSUMERS": 4,
    "LAB_MAX_BURST": 200,
    # How long one computation of a lab's panel fingerprints serves every viewer's /live (seconds; 0: per request).
    "LIVE_CACHE_SECONDS": 0.5,
    # A panel whose last load took this long or more is served at once from that load, marked with
    # its age, while it loads again in the background (seconds; 0: always loaded in the request).
    "LIVE_STALE_AFTER_SECONDS": 0.1,
    # Ceilings on what one request may start on the shared PostgreSQL and broker (unset: only the
    # operation's own bounds): events of one load-generator run, synthetic keys of one dedup warm-up.
    "LAB_MAX_LOAD_EVENTS": None,
    "LAB_MAX_WARMUP_KEYS": None,
    # "kafka" or "tansu" when the broker cannot be probed (a scenario needs to know which it runs on).
    "LAB_BROKER_KIND": None,
    # Wrong LAB_TOKEN guesses allowed per client address within the window, before 429.
    "SIGN_IN_MAX_FAILURES": 5,
    "SIGN_IN_WINDOW_SECONDS": 60.0,
    # 0 turns the shared panel cache off (every panel loaded in its request).
    "PANEL_CACHE": 1,
}

INTEGER_KEYS = {"LAB_PORT", "LAB_PARTITIONS", "LAB_HTTPS", "LAB_CLASSROOM", "LAB_CLASS_VIEW_OTHERS", "LAB_MAX_LABS",
                "LAB_MAX_CONSUMERS", "LAB_MAX_BURST", "LAB_MAX_LOAD_EVENTS", "LAB_MAX_WARMUP_KEYS",
                "SIGN_IN_MAX_FAILURES", "PANEL_CACHE"}
FLOAT_KEYS = {"LAB_COMMAND_TIMEOUT", "LIVE_CACHE_SECONDS", "LIVE_STALE_AFTER_SECONDS", "SIGN_IN_WINDOW_SECONDS"}
RUNNING_FILE = "running.json"


class ConfigError(ValueError):
    """The settings cannot start a safe lab; the message says which and why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _coerce(key: str, value: Any) -> Any:
    if value in (None, ""):
        return None if DEFAULTS.get(key) is None else DEFAULTS[key]
    try:
        if key in INTEGER_KEYS:
            return int(value)
        if key in FLOAT_KEYS:
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    return value


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
    """Defaults, then ``.env``, then the environment, then ``overrides`` (a test dict)."""
    environ = os.environ if environ is None else environ
    file_values = dotenv_values(env_file) if env_file and Path(env_file).exists() else {}
    config: dict[str, Any] = {}
    for key in DEFAULTS:
        raw = environ.get(key, file_values.get(key))
        config[key] = _coerce(key, raw)
    config.update(overrides or {})

    data_dir = Path(config["LAB_DATA_DIR"]).resolve()
    config["LAB_DATA_DIR"] = str(data_dir)
    running = running_services(data_dir)
    for key in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_PRODUCER_BOOTSTRAP_SERVERS"):
        if not config.get(key) and running.get(key):
            config[key] = running[key]
    config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] = (
        config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] or config["KAFKA_BOOTSTRAP_SERVERS"])
    if not config["SECRET_KEY"]:
        config["SECRET_KEY"] = _secret_key(data_dir)
    validate(config)
    return config


def validate(config: Mapping[str, Any]) -> None:
    """Refuse settings that would expose the controls or cannot work."""
    if not is_loopback(str(config["LAB_HOST"])) and not config.get("LAB_TOKEN"):
        raise ConfigError(
            f"LAB_HOST={config['LAB_HOST']} is not a loopback address: anyone on the network could "
            "drive the lab. Set LAB_TOKEN to a secret to protect the controls, or bind 127.0.0.1.")
    if not 1 <= int(config["LAB_PARTITIONS"]) <= 12:
        raise ConfigError(f"LAB_PARTITIONS must be between 1 and 12, got {config['LAB_PARTITIONS']}")
    if not 1 <= int(config["LAB_PORT"]) <= 65535:
        raise ConfigError(f"LAB_PORT must be a TCP port, got {config['LAB_PORT']}")
