"""The lab's settings as one typed model: each setting's type, bounds, default, classroom default and
description, read from a ``.env`` file, then the environment, then a test dict (highest wins).

A setting with a classroom default takes it when classroom mode is on (``LAB_CLASS_CODE`` or
``LAB_CLASSROOM=1``) and no source set it: a class of thirty shares one PostgreSQL and one broker,
so what one attendee may start is bounded unless the instructor says otherwise.
"""
from __future__ import annotations

import ipaddress
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from annotated_types import Ge, Le
from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

KIB = 1024
MIB = 1024 * KIB
# A token a guess at a time could not find: 16 characters and more (token_urlsafe(24) gives 32).
MIN_TOKEN_LENGTH = 16
MAKE_A_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(24))"'
# The secrets a file may hold instead of the environment (compose's `secrets:`): NAME_FILE names
# the file whose content is NAME.
SECRET_FILES = ("LAB_TOKEN", "SECRET_KEY")
# The environment a load reads (load_config's ``environ``), for the one source that reads it.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("lab_settings_environ", default=None)


class ConfigError(ValueError):
    """The settings cannot start a safe lab; the message says which and why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setting(default: Any, description: str, classroom: Any = None, **bounds: Any) -> Any:
    """A field of the model: its default, what it means (the generated table's text), and the value
    it takes in classroom mode when nothing sets it (None: the same as outside)."""
    extra = {"classroom_default": classroom} if classroom is not None else None
    return Field(default, description=description, json_schema_extra=extra, **bounds)


def classroom_default(field: FieldInfo) -> Any:
    """The value a field takes in classroom mode when no source sets it (None: no classroom default)."""
    extra = field.json_schema_extra
    return extra.get("classroom_default") if isinstance(extra, dict) else None


def value_type(field: FieldInfo) -> Any:
    """The type a field holds when set: ``int`` for ``int | None``, a Literal as it is."""
    annotation = field.annotation
    choices = [arg for arg in getattr(annotation, "__args__", ()) if arg is not type(None)]
    if getattr(annotation, "__origin__", None) is not Literal and len(choices) == 1:
        return choices[0]
    return annotation


# A switch: 0 or 1, as the environment writes it.
Flag = Annotated[int, Ge(0), Le(1)]


class _MappingEnvironment(EnvSettingsSource):
    """The environment source, over the mapping load_config was given (os.environ by default)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        if environ is None:
            return super()._load_env_vars()
        return parse_env_vars(environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class LabSettings(BaseSettings):
    """Every setting of the lab. Field names are the environment variables' names."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=True,
                                      validate_default=False, env_file=None)

    # --- services ---
    DATABASE_URL: str | None = setting(
        None, "Any PostgreSQL URL (`postgresql://user:pw@host/db`). Unset: the one a running `make run` "
        "wrote to `running.json` in LAB_DATA_DIR (`make run` itself starts an embedded PostgreSQL).")
    DATABASE_PASSWORD_FILE: str | None = setting(
        None, "A file holding the database password (a compose secret, `/run/secrets/...`): its content, "
        "without the trailing newline, becomes DATABASE_URL's password (URL-quoted), so the URL names no "
        "password. Needs DATABASE_URL.")
    KAFKA_BOOTSTRAP_SERVERS: str | None = setting(
        None, "`host:port[,host:port]` of Apache Kafka or another compatible broker. Unset: the one a running "
        "`make run` wrote to `running.json` (`make run` itself starts the embedded Tansu broker).")
    KAFKA_PRODUCER_BOOTSTRAP_SERVERS: str | None = setting(
        None, "Where the lab's producer reaches the broker: the lost-ack fault proxy when one runs. "
        "Unset: KAFKA_BOOTSTRAP_SERVERS.")
    KAFKA_LEARNER_LISTEN: str | None = setting(
        None, "Where the learners' gateway listens (`host:port`): the fault proxy's second listener, in front "
        "of the embedded broker, where a learner's own code authenticates with its lane's Kafka credentials "
        "(SASL_PLAINTEXT, PLAIN) and may read its lab's topic and use its lane's group only. Unset: a free "
        "loopback port (`make run` prints it). `0.0.0.0:PORT` for learners on other machines, with "
        "KAFKA_LEARNER_BOOTSTRAP_SERVERS set to the address they reach.")
    KAFKA_LEARNER_BOOTSTRAP_SERVERS: str | None = setting(
        None, "The broker address shown to learners (`host:port`), and the one the learners' gateway gives "
        "their clients as the broker's. Unset: KAFKA_LEARNER_LISTEN's address (with the embedded broker), "
        "or the one a running `make run` wrote to `running.json`.")
    KAFKA_LEARNER_SASL_MECHANISM: Literal["PLAIN", "SCRAM-SHA-512"] = setting(
        "PLAIN", "The SASL mechanism learners' clients use on KAFKA_LEARNER_BOOTSTRAP_SERVERS: `PLAIN` at the "
        "learners' gateway of the embedded broker, `SCRAM-SHA-512` at Apache Kafka's SASL listener (compose).")
    LAB_BROKER_KIND: Literal["kafka", "tansu"] | None = setting(
        None, "`kafka` or `tansu` when the broker cannot be probed (a scenario needs to know which it runs on). "
        "Unset: one metadata request tells (never from a web process).")
    LAB_NOTIFY_URL: str | None = setting(
        None, "Where consumers call the notification service (`http://host:port`); set, the agent starts none. "
        "Unset: each lab agent runs it on a loopback port.")
    LAB_NOTIFY_LISTEN: str | None = setting(
        None, "The notification service's listen address (`host:port`), read by the lab agent that starts "
        "it and by `python -m webapp.notify` without `--listen`. Unset: a free loopback port (the agent; "
        "`make run` picks one to print it), 127.0.0.1:8025 (the service on its own).")

    # --- the web app ---
    LAB_HOST: str = setting(
        "127.0.0.1", "Address the web app binds; a non-loopback address is refused unless LAB_TOKEN is set.",
        min_length=1)
    LAB_PORT: int = setting(5000, "The web app's TCP port.", ge=1, le=65535)
    LAB_DATA_DIR: str = setting(
        ".lab", "Embedded PostgreSQL data, logs, `running.json` and the generated SECRET_KEY (made absolute "
        "when loaded).", min_length=1)
    LAB_NAME: str = setting("default", "The lab namespace the dashboard shows (its schema, topics and groups).",
                            min_length=1)
    LAB_PARTITIONS: int = setting(3, "Partitions of the lab's payments topic.", ge=1, le=12)
    LAB_TOKEN: str | None = setting(
        None, "When set, every control (POST) needs it: a sign-in page for browsers, `Authorization: Bearer` "
        f"for scripts. Required for a non-loopback LAB_HOST. At least {MIN_TOKEN_LENGTH} characters: "
        f"`{MAKE_A_TOKEN}` makes one.")
    LAB_TOKEN_FILE: str | None = setting(
        None, "A file holding LAB_TOKEN (a compose secret, `/run/secrets/...`): its content, without the "
        "trailing newline, is the token. Setting both LAB_TOKEN and LAB_TOKEN_FILE is an error.")
    LAB_HTTPS: Flag = setting(
        0, "1 when browsers reach the lab over HTTPS (a TLS proxy in front): the session cookie gets Secure, "
        "responses Strict-Transport-Security.")
    SECRET_KEY: str | None = setting(
        None, "Signs sessions and CSRF tokens, and keys the session's digest of LAB_TOKEN. Unset: generated once into LAB_DATA_DIR/secret_key and kept "
        "there, so restarts and every web worker share it.")
    SECRET_KEY_FILE: str | None = setting(
        None, "A file holding SECRET_KEY (a compose secret): its content, without the trailing newline, is "
        "the key. Setting both SECRET_KEY and SECRET_KEY_FILE is an error.")
    LAB_COMMAND_TIMEOUT: float = setting(
        30.0, "How long the web waits for the lab agent to carry out a command (seconds).", gt=0)
    MAX_CONTENT_LENGTH: int | None = setting(
        1 * MIB, "The largest request body the web accepts (bytes; Flask's own setting): larger answers 413. "
        "1 MiB holds the largest raw record the lab produces (512 KiB of value) with its encoding. In a class, "
        "512 KiB: it still holds a class's largest raw record (LAB_MAX_RECORD_VALUE_BYTES, 64 KiB) several "
        "times over, and thirty attendees cannot post megabytes each at the shared web workers.",
        classroom=512 * KIB, ge=1)
    LIVE_CACHE_SECONDS: float = setting(
        0.5, "How long one computation of a lab's panel fingerprints serves every viewer's `/live` (seconds, "
        "per web process); 0 computes them per request.", ge=0)
    LIVE_STALE_AFTER_SECONDS: float = setting(
        0.1, "A panel whose last load took this long or more is served at once from that load, marked with "
        "its age, while one background thread loads it again (seconds); 0 loads every panel in its request. The "
        "status bar and the group forms always load in the request, and `GET /api/v1/state` is always computed "
        "per request.", ge=0)
    PANEL_CACHE: Flag = setting(1, "0 turns the shared panel cache off (every panel loaded in its request).")
    LIVE_PUSH: Flag = setting(
        1, "1: the dashboard's panels are pushed over server-sent events (`GET /stream`), each panel rendered "
        "once per change per lab for all its viewers; 0: every page polls `/live` once a second, as before.")
    LIVE_STREAMS_PER_WORKER: int = setting(
        96, "The most event streams one web process holds at once (each holds one of its WEB_THREADS threads "
        "while open). Past it a stream answers at once with a refusal and the page polls instead, saying so.",
        ge=0)
    LIVE_PUSHES_PER_SECOND: float = setting(
        4.0, "The most pushes a second to the viewers of one lab: changes in between are sent together "
        "(each changed panel once, as it is at that moment).", gt=0, le=50)
    LIVE_STREAM_SECONDS: float = setting(
        300.0, "How long one event stream stays open before the server ends it and the browser reconnects "
        "(getting the current state at once): no connection outlives a redeploy by long.", gt=0)
    SIGN_IN_MAX_FAILURES: int = setting(
        5, "Wrong LAB_TOKEN guesses allowed per client address within SIGN_IN_WINDOW_SECONDS, before 429.", ge=1)
    SIGN_IN_WINDOW_SECONDS: float = setting(
        60.0, "The window of SIGN_IN_MAX_FAILURES and JOIN_MAX_FAILURES (seconds).", gt=0)
    JOIN_MAX_FAILURES: int = setting(
        20, "Wrong class codes or rejoin codes allowed per client address within SIGN_IN_WINDOW_SECONDS, "
        "before 429 (failures only: a class behind one address joins; its mistypes share this budget).", ge=1)
    LIVE_STREAMS_PER_BROWSER: int = setting(
        6, "The most live event streams one browser session holds at once on one web process (its tabs); "
        "past it a stream is refused and the page polls.", ge=1)
    LAB_WEB_CONNECTIONS_PER_LAB: int = setting(
        4, "Classroom mode: a lab's requests that may use the web process's database pool at once; the next "
        "waits up to 2 s for one of them, then gets a 503 that says why. A learner's lock or flood slows "
        "their own lab only.", ge=1)

    # --- classroom mode (webapp/store/classroom.py) ---
    LAB_CLASS_CODE: str | None = setting(
        None, "Classroom mode: attendees join at `/join` with their name and this code, each gets a lab of "
        "their own, and the classroom defaults of this table apply.")
    LAB_CLASSROOM: Flag = setting(0, "1: classroom mode without a class code.")
    LAB_CLASS_VIEW_OTHERS: Flag = setting(0, "1: attendees may view (never drive) each other's labs.")
    LAB_AUTO_RECOVER_GROUPS: Flag = setting(
        0, "1: the agent recovers a stalled consumer group by itself (restart its members, then a fresh "
        "group id carrying the committed offsets over), once the stall has lasted its threshold. On in a "
        "class: nobody watches thirty status bars.", classroom=1)
    LAB_AGENT_COMMAND_WORKERS: int = setting(
        8, "Commands one lab agent carries out at once, each on a thread with its own PostgreSQL connection: "
        "commands of different labs run side by side, a lab's own commands one at a time in their order. "
        "A class's guided steps (a publish, a consumer's start, a lab's reset) then wait for their own lab, "
        "not behind thirty others'.", ge=1, le=64)
    LAB_MAX_LABS: int = setting(
        60, "Labs this database may hold: past it `/join` refuses a new attendee and a scenario run refuses "
        "to open a fresh lab; 0: no limit.", ge=0)
    LAB_MAX_CONSUMERS: int = setting(4, "Classroom mode: consumer processes one lab may run at once.", ge=0)
    LAB_MAX_BURST: int = setting(200, "Classroom mode: events in one burst.", ge=1)
    LAB_MAX_LANES: int = setting(
        3, "Classroom mode: lanes for a learner's own consumer (\"Your consumer\") one lab may have, each "
        "with its own PostgreSQL role and Kafka user.", ge=0)
    LAB_LANE_CONNECTION_LIMIT: int = setting(
        5, "Sessions one lane's PostgreSQL role may hold at once (its role's CONNECTION LIMIT): a learner's "
        "code that opens more is refused by PostgreSQL, the others' connections untouched.", ge=1, le=100)

    # --- what one request may start on the shared PostgreSQL and broker ---
    LAB_MAX_LOAD_EVENTS: int | None = setting(
        None, "Events of one load-generator run. Unset: only the operation's own bound (10,000,000). In a "
        "class, 50,000: enough to watch throughput and lag move (25 s at the class rate), and thirty such runs "
        "keep the shared broker's in-memory log and PostgreSQL's tables at a few million rows.",
        classroom=50_000, ge=1)
    LAB_MAX_LOAD_RATE: int | None = setting(
        None, "Events per second of one load-generator run; a run asked to go as fast as possible (rate 0) "
        "is paced at this rate. Unset: no pace is imposed. In a class, 2,000/s: several labs loading at once "
        "still leave the broker and PostgreSQL to the others' exercises on a small server.",
        classroom=2_000, ge=1)
    LAB_MAX_WARMUP_KEYS: int | None = setting(
        None, "Synthetic keys of one dedup warm-up. Unset: only the operation's own bound (10,000,000). In a "
        "class, 100,000: a dedup table big enough to see the index and the TTL at work; thirty labs of a "
        "million keys each (exercise 18 as run alone) would be 30 million rows in the shared PostgreSQL.",
        classroom=100_000, ge=1)
    LAB_EXPLORER_MAX_RUNS: int | None = setting(
        None, "Runs of one exploration (the explorer). Unset: only the operation's own bound (10,000). In a "
        "class, 20: each run starts consumers, publishes and injects faults on the shared broker and PostgreSQL, "
        "and an exploration asked for minutes only stops at this many runs too.", classroom=20, ge=1)
    LAB_EXPLORER_MAX_MINUTES: float | None = setting(
        None, "Minutes of one exploration. Unset: only the operation's own bound (a day). In a class, 10: a "
        "search and its shrinking fit in an exercise, and an exploration asked for runs only stops after this "
        "long too.", classroom=10.0, gt=0)
    LAB_MAX_RECORD_VALUE_BYTES: int | None = setting(
        None, "Bytes of a raw record's value (produce raw). Unset: only the operation's own bound (512 KiB). "
        "In a class, 64 KiB: far above any payment event, and the broker keeps every record in memory.",
        classroom=64 * KIB, ge=0)
    LAB_MAX_RECORD_HEADERS: int | None = setting(
        None, "Headers on one raw record. Unset: only the operation's own bound. In a class, 16: more than "
        "any exercise uses.", classroom=16, ge=0)
    LAB_MAX_RECORD_HEADER_BYTES: int | None = setting(
        None, "Bytes of one raw record header, name and value. Unset: only the operation's own bounds. In a "
        "class, 1 KiB: a header is an id or a short tag, and every panel shows them.", classroom=KIB, ge=1)

    # --- the processes' output ---
    LAB_LOG_TO_STDOUT: bool = setting(
        False, "1: the agent's children (consumers, relays, the notification service) log to its stdout "
        "(docker compose logs) instead of a file each under LAB_DATA_DIR/logs.")
    LAB_KAFKA_DEBUG: str = setting(
        "", "librdkafka debug contexts for the consumers (its `debug` property, e.g. `cgrp,protocol`: each "
        "JoinGroup, SyncGroup and Heartbeat answer), written to each consumer's log; empty: none. For "
        "tracing a group that stalls (bench/soak.py --kafka-debug).")

    @field_validator("LAB_BROKER_KIND", mode="before")
    @classmethod
    def _broker_kind_any_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """NAME_FILE's content is NAME; DATABASE_PASSWORD_FILE's content is DATABASE_URL's password."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in SECRET_FILES:
            path = data.get(f"{name}_FILE")
            if not path:
                continue
            if data.get(name):
                raise ValueError(f"{name} and {name}_FILE are both set: set one of them ({name}_FILE={path}).")
            data[name] = read_secret(f"{name}_FILE", path)
        path = data.get("DATABASE_PASSWORD_FILE")
        if path:
            data["DATABASE_URL"] = with_password(data.get("DATABASE_URL"),
                                                 read_secret("DATABASE_PASSWORD_FILE", path))
        return data

    @model_validator(mode="after")
    def _classroom_defaults(self) -> "LabSettings":
        """In classroom mode, a bounded value for every setting that has one and that no source set."""
        if self.LAB_CLASS_CODE or self.LAB_CLASSROOM:
            for name, field in type(self).model_fields.items():
                value = classroom_default(field)
                if value is not None and name not in self.model_fields_set:
                    setattr(self, name, value)
        return self

    @field_validator("KAFKA_LEARNER_LISTEN", "KAFKA_LEARNER_BOOTSTRAP_SERVERS")
    @classmethod
    def _host_and_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port")
        return value

    @model_validator(mode="after")
    def _learners_told_an_address_they_reach(self) -> "LabSettings":
        host = (self.KAFKA_LEARNER_LISTEN or "").rpartition(":")[0].strip("[]")
        if self.KAFKA_LEARNER_LISTEN and host in ("0.0.0.0", "::") and not self.KAFKA_LEARNER_BOOTSTRAP_SERVERS:
            raise ValueError(
                f"KAFKA_LEARNER_LISTEN={self.KAFKA_LEARNER_LISTEN} listens on every address: set "
                "KAFKA_LEARNER_BOOTSTRAP_SERVERS to the host:port learners reach (what the gateway advertises).")
        return self

    @model_validator(mode="after")
    def _loopback_unless_a_token(self) -> "LabSettings":
        if not is_loopback(self.LAB_HOST) and not self.LAB_TOKEN:
            raise ValueError(
                f"LAB_HOST={self.LAB_HOST} is not a loopback address: anyone on the network could drive the lab. "
                "Set LAB_TOKEN to a secret to protect the controls, or bind 127.0.0.1.")
        return self

    @model_validator(mode="after")
    def _a_class_needs_a_token(self) -> "LabSettings":
        # Without a token, whoever is not an attendee would be the instructor: anyone who reaches the
        # server could read every lab and reset the class.
        if (self.LAB_CLASS_CODE or self.LAB_CLASSROOM) and not self.LAB_TOKEN:
            raise ValueError(
                "Classroom mode (LAB_CLASS_CODE or LAB_CLASSROOM) needs LAB_TOKEN: the token is what makes the "
                f"instructor the instructor. Make one with `{MAKE_A_TOKEN}`.")
        return self

    @model_validator(mode="after")
    def _a_token_long_enough(self) -> "LabSettings":
        # The message never shows the token: it ends up in logs.
        if self.LAB_TOKEN and len(self.LAB_TOKEN) < MIN_TOKEN_LENGTH:
            source = f" (from LAB_TOKEN_FILE={self.LAB_TOKEN_FILE})" if self.LAB_TOKEN_FILE else ""
            raise ValueError(
                f"LAB_TOKEN{source} has {len(self.LAB_TOKEN)} characters: at least {MIN_TOKEN_LENGTH} are needed, "
                f"or a guesser could find it. Make one with `{MAKE_A_TOKEN}`.")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: the test dict, the environment (load_config's mapping), the .env file.
        return init_settings, _MappingEnvironment(settings_cls), dotenv_settings


def read_secret(setting_name: str, path: str) -> str:
    """The content of the file a ``*_FILE`` setting names, without its trailing newline."""
    try:
        value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as problem:
        raise ValueError(f"{setting_name}={path}: cannot read the file ({problem}).") from None
    if not value:
        raise ValueError(f"{setting_name}={path}: the file is empty.")
    return value


def with_password(url: str | None, password: str) -> str:
    """``url`` with ``password`` as its password (URL-quoted); the user and the rest kept."""
    parts = urlsplit(url) if url else None
    if parts is None or not parts.scheme or not parts.netloc:
        raise ValueError("DATABASE_PASSWORD_FILE is set, but DATABASE_URL is not a URL "
                         "(`postgresql://user@host:port/db`) to put the password in.")
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or not userinfo.partition(":")[0]:
        raise ValueError("DATABASE_PASSWORD_FILE is set, but DATABASE_URL names no user "
                         "(`postgresql://user@host:port/db`).")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


def load_settings(environ: Mapping[str, str] | None, overrides: Mapping[str, Any], env_file: Any) -> LabSettings:
    """The model from ``env_file``, then ``environ`` (None: os.environ), then ``overrides``; a
    ConfigError naming the setting when a value does not fit."""
    from pydantic import ValidationError

    token = _ENVIRON.set(environ)
    try:
        return LabSettings(_env_file=env_file, **overrides)
    except ValidationError as problem:
        raise ConfigError(describe(problem)) from None
    finally:
        _ENVIRON.reset(token)


def describe(problem: Any) -> str:
    """One line per setting that does not fit: its name, what is wrong, and the value given."""
    lines = []
    for error in problem.errors():
        if error["loc"]:
            name = str(error["loc"][0])
            lines.append(f"{name}: {error['msg'].lower()}, got {error['input']!r}")
        else:  # a rule across settings (the loopback rule): its message names them
            lines.append(str(error["msg"]).removeprefix("Value error, "))
    return "; ".join(lines)
