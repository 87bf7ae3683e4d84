# The Idempotency Lab image: the web app (gunicorn, the default command), the lab agent
# (`python -m webapp.supervisor`) and the CLI (`flask --app app lab ...`) from one image.
# docker-compose.yml runs it against Apache Kafka and PostgreSQL; see README "Run with Docker Compose".
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LAB_DATA_DIR=/var/lib/lab \
    LAB_PORT=5000

WORKDIR /app

# Dependencies first, in their own layer: it is rebuilt only when pyproject.toml changes.
# The list is read from pyproject.toml itself, so the image and `make run` install the same set.
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/requirements.txt', 'w').write('\n'.join(deps) + '\n')" \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The source, owned by root and read-only to the lab user; bytecode compiled once here.
COPY . .
RUN python -m compileall -q webapp app.py \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/lab --create-home --shell /usr/sbin/nologin lab

# Not root: the web app, the agent and the consumer processes it starts all run as `lab`.
USER lab

EXPOSE 5000

# /healthz answers 200 only when PostgreSQL answers and a lab agent reports Kafka reachable.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LAB_PORT', '5000'), timeout=4)"]

# The web app under gunicorn with the lab's config file (threaded workers for the live panels).
# It binds LAB_HOST (127.0.0.1 unless set); a non-loopback LAB_HOST needs LAB_TOKEN.
CMD ["gunicorn", "--config", "gunicorn.conf.py", "app:app"]
