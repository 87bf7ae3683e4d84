"""Settings: defaults, environment, test dict; the loopback rule; the kept SECRET_KEY; every
setting the code reads is one the environment sets."""
import re
from pathlib import Path

import pytest

from webapp import create_app
from webapp.settings import DEFAULTS, FLOAT_KEYS, INTEGER_KEYS, ConfigError, is_loopback, load_config

WEBAPP = Path(__file__).resolve().parent.parent / "webapp"
# A setting's name, wherever the code names it: `app.config["X"]`, `config.get("X")`, and the keys
# handed to helpers that read the config (`limit(ctx.config, "LAB_MAX_CONSUMERS")`).
SETTING_NAME = re.compile(r"""["']((?:LAB|LIVE|KAFKA|DATABASE|SIGN_IN|PANEL|SECRET)_[A-Z0-9_]+)["']""")
# Variables the agent and the launcher set for the processes they start (not the lab's settings).
PROCESS_ENVIRONMENT = {"LAB_AGENT_ID", "LAB_LOG_TO_STDOUT", "LAB_NOTIFY_LISTEN", "LAB_NOTIFY_URL"}


def config(tmp_path, environ=None, **overrides):
    return load_config(environ={"LAB_DATA_DIR": str(tmp_path), **(environ or {})}, overrides=overrides,
                       env_file=None)


def test_defaults(tmp_path):
    c = config(tmp_path)
    assert c["LAB_HOST"] == "127.0.0.1"
    assert c["LAB_PORT"] == 5000
    assert c["LAB_PARTITIONS"] == 3
    assert c["DATABASE_URL"] is None


def test_environment_then_overrides(tmp_path):
    c = config(tmp_path, {"LAB_PORT": "5050", "DATABASE_URL": "postgresql://env/db"}, LAB_PORT=6000)
    assert c["LAB_PORT"] == 6000
    assert c["DATABASE_URL"] == "postgresql://env/db"


def test_env_file_is_read(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("LAB_PARTITIONS=4\n")
    c = load_config(environ={"LAB_DATA_DIR": str(tmp_path)}, env_file=env_file)
    assert c["LAB_PARTITIONS"] == 4


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "lab.example"])
def test_non_loopback_bind_needs_a_token(tmp_path, host):
    with pytest.raises(ConfigError, match="LAB_TOKEN"):
        config(tmp_path, {"LAB_HOST": host})
    assert config(tmp_path, {"LAB_HOST": host, "LAB_TOKEN": "s3cret"})["LAB_HOST"] == host


@pytest.mark.parametrize("host,expected", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False), ("10.0.0.1", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_lab_https_is_off_unless_set_to_1(tmp_path):
    assert config(tmp_path)["LAB_HTTPS"] == 0
    assert config(tmp_path, {"LAB_HTTPS": "1"})["LAB_HTTPS"] == 1


@pytest.mark.parametrize("key,value", [("LAB_PORT", "eighty"), ("LAB_PARTITIONS", "0"), ("LAB_PARTITIONS", "99"),
                                       ("LAB_HTTPS", "yes")])
def test_bad_numbers_are_refused_clearly(tmp_path, key, value):
    with pytest.raises(ConfigError, match=key):
        config(tmp_path, {key: value})


def test_secret_key_is_generated_once_and_kept(tmp_path):
    first = config(tmp_path)["SECRET_KEY"]
    assert len(first) == 64
    assert config(tmp_path)["SECRET_KEY"] == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_running_lab_supplies_service_addresses(tmp_path):
    (tmp_path / "running.json").write_text('{"DATABASE_URL": "postgresql://run/db", "KAFKA_BOOTSTRAP_SERVERS": "x:1"}')
    c = config(tmp_path)
    assert c["DATABASE_URL"] == "postgresql://run/db"
    assert c["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] == "x:1"


def settings_the_code_names() -> set[str]:
    return {key for path in WEBAPP.rglob("*.py") for key in SETTING_NAME.findall(path.read_text())}


def test_every_setting_the_code_reads_is_a_setting():
    named = settings_the_code_names()
    assert {"LAB_MAX_LOAD_EVENTS", "LAB_MAX_WARMUP_KEYS", "LAB_TOKEN", "SECRET_KEY"} <= named, "the scan finds them"
    assert named - PROCESS_ENVIRONMENT - set(DEFAULTS) == set(), "named by the code, but no environment variable sets it"


def sample(key: str, tmp_path) -> tuple[str, object]:
    """A value for ``key`` as the environment gives it, and as the config should hold it."""
    if key in INTEGER_KEYS:
        return "7", 7
    if key in FLOAT_KEYS:
        return "2.5", 2.5
    if key == "LAB_DATA_DIR":
        return str(tmp_path / "elsewhere"), str((tmp_path / "elsewhere").resolve())
    if key == "LAB_HOST":
        return "127.0.0.2", "127.0.0.2"
    return f"value-of-{key.lower()}", f"value-of-{key.lower()}"


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_each_setting_is_read_from_the_environment(tmp_path, key):
    raw, expected = sample(key, tmp_path)
    assert config(tmp_path, {key: raw})[key] == expected


def test_a_ceiling_set_in_the_environment_reaches_the_operation(services, tmp_path, monkeypatch):
    """LAB_MAX_LOAD_EVENTS from the environment (not a test dict) refuses a larger load, naming it."""
    monkeypatch.setenv("LAB_MAX_LOAD_EVENTS", "100")
    app = create_app({"TESTING": True, "DATABASE_URL": services.database_url, "LAB_DATA_DIR": str(tmp_path),
                      "KAFKA_BOOTSTRAP_SERVERS": services.bootstrap_servers, "WTF_CSRF_ENABLED": False})
    try:
        assert app.config["LAB_MAX_LOAD_EVENTS"] == 100
        answer = app.test_client().post("/api/v1/load", json={"events": 101})
        assert answer.status_code == 400 and "LAB_MAX_LOAD_EVENTS" in answer.get_data(as_text=True), answer.get_data()
    finally:
        from webapp.web.db import db
        with app.app_context():
            db.engine.dispose()
