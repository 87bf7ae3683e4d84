"""gunicorn settings for the lab's web app (used by `make run` and the Docker image).

Threaded workers: a control request may wait up to a few seconds for the lab agent, and each open
dashboard holds one event stream (webapp/web/push.py) in a thread while it is open; threads keep
them from queuing behind each other. 112 threads a worker: LIVE_STREAMS_PER_WORKER (96) streams, and
16 threads left for requests, however many streams are open. 96, not half of a room's screens: gunicorn
does not spread connections evenly between its workers, and one worker may be handed most of them. A stream past the cap is refused at
once (the page polls). No Kafka client lives in these processes, so forking them is safe.
"""
import os

bind = f"{os.environ.get('LAB_HOST', '127.0.0.1')}:{os.environ.get('LAB_PORT', '5000')}"
workers = int(os.environ.get("WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "112"))
timeout = 60
graceful_timeout = 10
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("WEB_LOG_LEVEL", "warning")
# Worker heartbeat files in memory: in a container an overlay filesystem can stall them.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None


def on_starting(server):
    """Settle the settings once, in the master, before any worker forks.

    A setting the lab refuses (a non-loopback LAB_HOST without LAB_TOKEN, say) stops gunicorn
    here with its reason instead of in every worker, and the generated SECRET_KEY is written to
    the data dir once, so that all workers sign sessions and CSRF tokens with the same key.
    """
    from webapp.settings import ConfigError, load_config

    try:
        load_config()
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
