"""Settings: one typed model (defaults, .env, environment, test dict); the loopback rule; the kept
SECRET_KEY; classroom defaults; the generated table; every setting the code reads is one the
environment sets, and a ceiling set in the environment reaches the operation."""
import re
import runpy
from pathlib import Path
from typing import Literal

import pytest
from annotated_types import Ge, Gt, Le

from webapp import create_app, ops
from webapp.domain.lab import Lab
from webapp.domain.vocabulary import AGENT_PID, HOLD_ACK_FD
from webapp.settings import (
    DEFAULTS,
    ConfigError,
    LabSettings,
    database_url,
    is_loopback,
    load_config,
    reference_markdown,
)
from webapp.settings.model import classroom_default, value_type

WEBAPP = Path(__file__).resolve().parent.parent / "webapp"
# A setting's name, wherever the code names it: `app.config["X"]`, `config.get("X")`, and the keys
# handed to helpers that read the config (`limit(ctx.config, "LAB_MAX_CONSUMERS")`).
SETTING_NAME = re.compile(r"""["']((?:LAB|LIVE|KAFKA|DATABASE|SIGN_IN|PANEL|SECRET)_[A-Z0-9_]+)["']""")
# Variables the agent and the launcher set for the processes they start (not the lab's settings):
# the agent's id and pid, and the pipe a held sidecar answers on.
PROCESS_ENVIRONMENT = {"LAB_AGENT_ID", "LAB_NOTIFY_LISTEN", AGENT_PID, HOLD_ACK_FD}
# The ceilings a class gets without setting them (the model's classroom defaults).
CLASSROOM_CEILINGS = {"LAB_MAX_LOAD_EVENTS": 50_000, "LAB_MAX_LOAD_RATE": 2_000, "LAB_MAX_WARMUP_KEYS": 100_000,
                      "LAB_MAX_RECORD_VALUE_BYTES": 64 * 1024, "LAB_MAX_RECORD_HEADERS": 16,
                      "LAB_MAX_RECORD_HEADER_BYTES": 1024, "MAX_CONTENT_LENGTH": 512 * 1024,
                      "LAB_EXPLORER_MAX_RUNS": 20, "LAB_EXPLORER_MAX_MINUTES": 10.0,
                      # not a ceiling, but a classroom default too: stalled groups recovered without a click
                      "LAB_AUTO_RECOVER_GROUPS": 1}


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
    assert config(tmp_path, {"LAB_HOST": host, "LAB_TOKEN": "s3cret-token-of-the-lab"})["LAB_HOST"] == host


@pytest.mark.parametrize("host,expected", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False), ("10.0.0.1", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_lab_https_is_off_unless_set_to_1(tmp_path):
    assert config(tmp_path)["LAB_HTTPS"] == 0
    assert config(tmp_path, {"LAB_HTTPS": "1"})["LAB_HTTPS"] == 1


@pytest.mark.parametrize("key,value,problem", [
    ("LAB_PORT", "eighty", "valid integer"), ("LAB_PORT", "0", "greater than or equal to 1"),
    ("LAB_PORT", "65536", "less than or equal to 65535"), ("LAB_PARTITIONS", "0", "greater than or equal to 1"),
    ("LAB_PARTITIONS", "99", "less than or equal to 12"), ("LAB_HTTPS", "yes", "valid integer"),
    ("LAB_HTTPS", "2", "less than or equal to 1"), ("LAB_MAX_LOAD_EVENTS", "-1", "greater than or equal to 1"),
    ("LAB_MAX_CONSUMERS", "-1", "greater than or equal to 0"), ("LAB_COMMAND_TIMEOUT", "0", "greater than 0"),
    ("LAB_BROKER_KIND", "redpanda", "'kafka' or 'tansu'")])
def test_bad_values_are_refused_naming_the_setting_and_the_value(tmp_path, key, value, problem):
    with pytest.raises(ConfigError) as refused:
        config(tmp_path, {key: value})
    assert str(refused.value).startswith(f"{key}: ") and problem in str(refused.value) \
        and repr(value) in str(refused.value), refused.value


def test_a_test_dict_is_checked_like_the_environment_and_its_other_keys_pass_through(tmp_path):
    with pytest.raises(ConfigError, match="LAB_PARTITIONS"):
        config(tmp_path, LAB_PARTITIONS=0)
    assert config(tmp_path, TESTING=True)["TESTING"] is True


def test_an_empty_value_is_unset(tmp_path):
    assert config(tmp_path, {"LAB_PORT": "", "LAB_TOKEN": ""})["LAB_PORT"] == 5000
    assert config(tmp_path, {"LAB_TOKEN": ""})["LAB_TOKEN"] is None


def test_the_environment_wins_over_the_env_file(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("LAB_PARTITIONS=4\nLAB_PORT=5001\n")
    c = load_config(environ={"LAB_DATA_DIR": str(tmp_path), "LAB_PORT": "5002"}, env_file=env_file)
    assert (c["LAB_PARTITIONS"], c["LAB_PORT"]) == (4, 5002)


def test_the_broker_kind_is_read_in_any_case(tmp_path):
    assert config(tmp_path, {"LAB_BROKER_KIND": "Tansu"})["LAB_BROKER_KIND"] == "tansu"


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
    """A value for ``key`` as the environment gives it, and as the config should hold it: from the
    model's type and bounds, and never its default (so reading it is seen)."""
    field = LabSettings.model_fields[key]
    kind = value_type(field)
    if getattr(kind, "__origin__", None) is Literal:
        choice = next(c for c in kind.__args__ if c != field.default)
        return str(choice), choice
    if kind is bool:
        return "1", True
    if kind in (int, float):
        low = next((rule.ge for rule in field.metadata if isinstance(rule, Ge)), None)
        high = next((rule.le for rule in field.metadata if isinstance(rule, Le)), None)
        positive = any(isinstance(rule, Gt) for rule in field.metadata)
        value = kind(7) if kind is int else 2.5
        if high is not None and value > high:
            value = kind(high if high != field.default else low)
        assert (low is None or value >= low) and not (positive and value <= 0) and value != field.default, key
        return str(value), value
    if key == "LAB_DATA_DIR":
        return str(tmp_path / "elsewhere"), str((tmp_path / "elsewhere").resolve())
    if key == "LAB_HOST":
        return "127.0.0.2", "127.0.0.2"
    if key in ("KAFKA_LEARNER_LISTEN", "KAFKA_LEARNER_BOOTSTRAP_SERVERS"):  # host:port, checked
        return "127.0.0.3:9095", "127.0.0.3:9095"
    if key.endswith("_FILE"):
        secret = tmp_path / key.lower()
        secret.write_text(f"value-of-{key.lower()}\n")
        return str(secret), str(secret)
    return f"value-of-{key.lower()}", f"value-of-{key.lower()}"


# What a setting needs beside it to be valid: a password file, a URL to put the password in.
NEEDS = {"DATABASE_PASSWORD_FILE": {"DATABASE_URL": "postgresql://lab@db.example:5432/lab"},
         "LAB_CLASS_CODE": {"LAB_TOKEN": "an-instructor-token-of-24ch"},
         "LAB_CLASSROOM": {"LAB_TOKEN": "an-instructor-token-of-24ch"}}


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_each_setting_is_read_from_the_environment(tmp_path, key):
    raw, expected = sample(key, tmp_path)
    assert config(tmp_path, {**NEEDS.get(key, {}), key: raw})[key] == expected


# --- the token's length, secrets from files ---------------------------------------------------------

@pytest.mark.parametrize("switch", [{"LAB_CLASS_CODE": "blue-heron"}, {"LAB_CLASSROOM": "1"}])
def test_classroom_mode_without_a_token_stops_the_process_and_says_why(tmp_path, switch):
    """Without a token, whoever is not an attendee would be the instructor."""
    with pytest.raises(ConfigError) as refused:
        config(tmp_path, switch)
    assert "Classroom mode (LAB_CLASS_CODE or LAB_CLASSROOM) needs LAB_TOKEN" in str(refused.value)


TOKEN = "a-token-of-16-ch"


def test_a_token_shorter_than_16_characters_stops_the_process_and_says_how_to_make_one(tmp_path):
    assert len(TOKEN) == 16 and config(tmp_path, {"LAB_TOKEN": TOKEN})["LAB_TOKEN"] == TOKEN
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(ConfigError) as refused:
            config(tmp_path, {"LAB_HOST": host, "LAB_TOKEN": TOKEN[:-1]})
        message = str(refused.value)
        assert "LAB_TOKEN" in message and "15 characters" in message and "at least 16" in message
        assert 'python -c "import secrets; print(secrets.token_urlsafe(24))"' in message
        assert TOKEN[:-1] not in message, "the token never reaches a log"
    with pytest.raises(ConfigError, match="at least 16"):
        config(tmp_path, LAB_TOKEN="short")


@pytest.mark.parametrize("name", ["LAB_TOKEN", "SECRET_KEY"])
def test_a_secret_is_read_from_the_file_its_file_setting_names(tmp_path, name):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-from-a-file-0123\n")
    c = config(tmp_path, {f"{name}_FILE": str(secret)})
    assert c[name] == "a-secret-from-a-file-0123", "the content, without the trailing newline"
    assert c[f"{name}_FILE"] == str(secret)
    # A file token counts for the loopback rule and for the length rule alike.
    if name == "LAB_TOKEN":
        assert config(tmp_path, {"LAB_HOST": "0.0.0.0", "LAB_TOKEN_FILE": str(secret)})["LAB_HOST"] == "0.0.0.0"
        secret.write_text("short\n")
        with pytest.raises(ConfigError, match=f"LAB_TOKEN \\(from LAB_TOKEN_FILE={secret}\\) has 5 characters"):
            config(tmp_path, {"LAB_TOKEN_FILE": str(secret)})


@pytest.mark.parametrize("name", ["LAB_TOKEN", "SECRET_KEY", "DATABASE_PASSWORD"])
def test_a_value_and_its_file_both_set_or_a_file_that_cannot_be_read_is_refused(tmp_path, name):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-from-a-file-0123\n")
    base = {"DATABASE_URL": "postgresql://lab@db:5432/lab"}
    if name != "DATABASE_PASSWORD":
        with pytest.raises(ConfigError, match=f"{name} and {name}_FILE are both set"):
            config(tmp_path, {**base, name: "a-value-of-its-own-0123", f"{name}_FILE": str(secret)})
    missing = tmp_path / "no-such-file"
    with pytest.raises(ConfigError, match=f"{name}_FILE={missing}: cannot read the file"):
        config(tmp_path, {**base, f"{name}_FILE": str(missing)})
    with pytest.raises(ConfigError, match=f"{name}_FILE={tmp_path}: cannot read the file"):
        config(tmp_path, {**base, f"{name}_FILE": str(tmp_path)})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        config(tmp_path, {**base, f"{name}_FILE": str(tmp_path / "empty")})


@pytest.mark.parametrize("url,expected", [
    ("postgresql://lab@postgres:5432/lab", "postgresql://lab:p%40ss%3Aw%2Frd%20%25%23%3F@postgres:5432/lab"),
    # a password in the URL is replaced: a child given the full URL and the file gets the same one
    ("postgresql://lab:old@postgres:5432/lab?sslmode=disable",
     "postgresql://lab:p%40ss%3Aw%2Frd%20%25%23%3F@postgres:5432/lab?sslmode=disable"),
])
def test_the_database_password_file_goes_into_the_url_quoted(tmp_path, url, expected):
    secret = tmp_path / "postgres_password"
    secret.write_text("p@ss:w/rd %#?\n")
    environ = {"DATABASE_URL": url, "DATABASE_PASSWORD_FILE": str(secret)}
    assert config(tmp_path, environ)["DATABASE_URL"] == expected
    assert config(tmp_path, {**environ, "DATABASE_URL": expected})["DATABASE_URL"] == expected
    # What the sidecars read (fault proxy, notification service, the agents' healthcheck): the same URL.
    assert database_url(environ) == expected and database_url({"DATABASE_URL": url}) == url
    from psycopg.conninfo import conninfo_to_dict
    assert conninfo_to_dict(expected)["password"] == "p@ss:w/rd %#?", "libpq reads the password back"


@pytest.mark.parametrize("url", [None, "host=db user=lab", "postgresql://db.example:5432/lab"])
def test_the_database_password_file_needs_a_url_with_a_user(tmp_path, url):
    secret = tmp_path / "postgres_password"
    secret.write_text("pw\n")
    environ = {"DATABASE_PASSWORD_FILE": str(secret), **({"DATABASE_URL": url} if url else {})}
    with pytest.raises(ConfigError, match="DATABASE_PASSWORD_FILE is set, but DATABASE_URL"):
        config(tmp_path, environ)
    with pytest.raises(ConfigError, match="DATABASE_PASSWORD_FILE is set, but DATABASE_URL"):
        database_url(environ)


def test_every_setting_has_a_description():
    assert [name for name, field in LabSettings.model_fields.items() if not (field.description or "").strip()] == []


def test_the_generated_table_lists_every_setting_with_its_type_default_and_description(capsys):
    table = reference_markdown()
    rows = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines()[2:]}
    assert list(rows) == list(LabSettings.model_fields), "one row per setting, in the model's order"
    assert "| `LAB_PORT` | integer 1–65535 | `5000` |  | The web app's TCP port. |" in table
    assert rows["LAB_MAX_LOAD_EVENTS"].startswith("| `LAB_MAX_LOAD_EVENTS` | integer ≥ 1 | unset | `50000` | ")
    assert "0 or 1" in rows["LAB_HTTPS"] and "`kafka` or `tansu`" in rows["LAB_BROKER_KIND"]
    runpy.run_module("webapp.settings", run_name="__main__")
    assert capsys.readouterr().out == table, "`python -m webapp.settings` prints it"


# --- classroom defaults ----------------------------------------------------------------------------

def test_outside_classroom_mode_the_ceilings_are_unset(tmp_path):
    c = config(tmp_path)
    assert {key: c[key] for key in CLASSROOM_CEILINGS} == {**{key: None for key in CLASSROOM_CEILINGS},
                                                           "MAX_CONTENT_LENGTH": 1024 * 1024,
                                                           "LAB_AUTO_RECOVER_GROUPS": 0}


INSTRUCTOR_TOKEN = {"LAB_TOKEN": "an-instructor-token-of-24ch"}


@pytest.mark.parametrize("switch", [{"LAB_CLASS_CODE": "blue-heron"}, {"LAB_CLASSROOM": "1"}])
def test_classroom_mode_alone_applies_the_classroom_defaults(tmp_path, switch):
    c = config(tmp_path, {**switch, **INSTRUCTOR_TOKEN})
    assert {key: c[key] for key in CLASSROOM_CEILINGS} == CLASSROOM_CEILINGS
    assert CLASSROOM_CEILINGS == {name: classroom_default(field) for name, field in LabSettings.model_fields.items()
                                  if classroom_default(field) is not None}, "the test knows every classroom default"


def test_in_classroom_mode_a_value_set_anywhere_wins_over_the_classroom_default(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("LAB_MAX_WARMUP_KEYS=1000000\n")
    c = load_config(environ={"LAB_DATA_DIR": str(tmp_path), "LAB_CLASSROOM": "1", "LAB_MAX_LOAD_EVENTS": "500000",
                             **INSTRUCTOR_TOKEN},
                    overrides={"LAB_MAX_LOAD_RATE": 10}, env_file=env_file)
    assert (c["LAB_MAX_LOAD_EVENTS"], c["LAB_MAX_LOAD_RATE"], c["LAB_MAX_WARMUP_KEYS"]) == (500_000, 10, 1_000_000)
    assert c["LAB_MAX_RECORD_HEADERS"] == 16, "the others keep their classroom default"


# --- from the environment to the operation (the session's services; no agent needed: refused first) --

def app_from_the_environment(services, tmp_path):
    """An app whose ceilings come from the environment only (no test dict sets them)."""
    return create_app({"TESTING": True, "DATABASE_URL": services.database_url, "LAB_DATA_DIR": str(tmp_path),
                       "KAFKA_BOOTSTRAP_SERVERS": services.bootstrap_servers, "WTF_CSRF_ENABLED": False})


def dispose(app):
    from webapp.web.db import db
    with app.app_context():
        db.engine.dispose()


def test_classroom_mode_from_the_environment_refuses_what_the_classroom_defaults_forbid(services, tmp_path,
                                                                                         monkeypatch):
    """LAB_CLASSROOM=1 and nothing else: a load, its rate and a warm-up past the defaults are refused."""
    monkeypatch.setenv("LAB_CLASSROOM", "1")
    monkeypatch.setenv("LAB_TOKEN", INSTRUCTOR_TOKEN["LAB_TOKEN"])
    app = app_from_the_environment(services, tmp_path)
    try:
        from webapp.web.db import db
        with app.app_context():
            ctx = ops.Context(db.engine, Lab("never_created"), app.config)
            for operation, body, named in [("start_load", {"events": 50_001}, "LAB_MAX_LOAD_EVENTS"),
                                           ("start_load", {"events": 10, "rate_per_second": 2_001},
                                            "LAB_MAX_LOAD_RATE"),
                                           ("dedup_warmup", {"keys": 100_001}, "LAB_MAX_WARMUP_KEYS")]:
                with pytest.raises(ops.InvalidRequest, match=named) as refused:
                    ops.call(operation, ctx, body)
                assert f"must be at most {CLASSROOM_CEILINGS[named]:,}" in refused.value.message
    finally:
        dispose(app)


def test_a_ceiling_set_in_the_environment_reaches_the_operation(services, tmp_path, monkeypatch):
    """Ceilings from the environment (not a test dict) refuse a larger load, rate or warm-up: 400 naming them."""
    monkeypatch.setenv("LAB_MAX_LOAD_EVENTS", "100")
    monkeypatch.setenv("LAB_MAX_LOAD_RATE", "50")
    monkeypatch.setenv("LAB_MAX_WARMUP_KEYS", "1000")
    app = app_from_the_environment(services, tmp_path)
    try:
        assert (app.config["LAB_MAX_LOAD_EVENTS"], app.config["LAB_MAX_LOAD_RATE"]) == (100, 50)
        client = app.test_client()
        for path, body, field, named in [("/load", {"events": 101}, "events", "LAB_MAX_LOAD_EVENTS"),
                                         ("/load", {"events": 10, "rate_per_second": 51}, "rate_per_second",
                                          "LAB_MAX_LOAD_RATE"),
                                         ("/dedup/warmup", {"keys": 1001}, "keys", "LAB_MAX_WARMUP_KEYS")]:
            answer = client.post(f"/api/v1{path}", json=body)
            assert answer.status_code == 400, answer.get_data()
            assert answer.get_json()["field"] == field and named in answer.get_json()["error"], answer.get_json()
    finally:
        dispose(app)
