# The Idempotency Lab image: the web app (gunicorn, the default command), the lab agent
# (`python -m webapp.agent`) and the CLI (`flask --app app lab ...`) from one image.
# docker-compose.yml runs it against Apache Kafka and PostgreSQL; see docs/operations/compose.md.
# No HEALTHCHECK here: what "healthy" means depends on the role, so compose declares each one's.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LAB_DATA_DIR=/var/lib/lab \
    LAB_PORT=5000

WORKDIR /app

# Dependencies first, in their own layer: it is rebuilt only when pyproject.toml or the lock changes.
# The list is read from pyproject.toml itself (the base dependencies only: not the `embedded`
# extra, the image runs against real services), at the versions pinned in requirements.lock,
# the same pins `make run` installs.
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/requirements.txt', 'w').write('\n'.join(deps) + '\n')" \
    && pip install -c requirements.lock -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The source, owned by root and read-only to the lab user whatever the host's umask left on the
# files (COPY keeps their modes); bytecode compiled once here. /var/lib/lab (LAB_DATA_DIR) is the
# lab user's home: compose mounts a named volume there, which starts as a copy of it (owner included).
COPY . .
RUN python -m compileall -q webapp app.py \
    && chmod -R u=rwX,go=rX /app \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/lab --create-home --shell /usr/sbin/nologin lab

# Not root: the web app, the agent and the consumer processes it starts all run as `lab`.
USER lab

EXPOSE 5000

# The web app under gunicorn with the lab's config file (threaded workers for the live panels).
# It binds LAB_HOST (127.0.0.1 unless set); a non-loopback LAB_HOST needs LAB_TOKEN.
CMD ["gunicorn", "--config", "gunicorn.conf.py", "app:app"]
