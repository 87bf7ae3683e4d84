"""Live panels pushed over server-sent events (issue 32): ``GET /stream``, one per open dashboard.

Polling cost viewers × changes: every page asked ``/live`` each second and fetched each changed
panel. Pushing costs changes: per web process,

- one thread LISTENs on ``lab_change`` (store/lab_changes.py: every writer of a lab's data
  announces its lab at commit) on one psycopg connection, reconnecting with backoff;
- one thread looks at each lab that has viewers here when it was announced, and once a second
  anyway (an agent's heartbeat growing old writes nothing), at most LIVE_PUSHES_PER_SECOND times a
  second per lab: it computes the lab's fingerprints once, renders each changed panel once with its
  partial template (dashboard.render_pushed) and puts the same event on every viewer's queue;
- each stream is one request thread of the worker (gunicorn gthread) that waits on its queue.

A new stream (a reconnect too) gets every panel as last rendered for its lab at once, and the lab
is looked at again right away. Limits: LIVE_STREAMS_PER_WORKER streams per process; past it the
stream answers one ``refused`` event with the reason and ends, and the page polls, saying so. A
viewer too slow to take its events (a full queue) has its stream ended; its browser reconnects and
gets the current state. A viewer costs a thread (its stack is mostly untouched virtual memory), a
queue of at most QUEUE_EVENTS events and a socket; the panels' HTML is shared.

Access: the stream is the request's lab (access.current_lab), as every page: in classroom mode an
attendee's own lab, or the one the instructor or a permitted attendee views read-only.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import psycopg
from flask import Blueprint, Flask, Response, current_app, g
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import InvalidLabName, Lab
from ..store.connection import psycopg_conninfo
from ..store.lab_changes import CHANNEL
from .access import current_lab

bp = Blueprint("push", __name__)
log = logging.getLogger(__name__)

EXTENSION = "lab_push"
QUEUE_EVENTS = 256     # a viewer this far behind is cut off (it reconnects and gets the current state)
KEEPALIVE_SECONDS = 10.0  # a comment line this often: proxies keep the stream, a gone browser is noticed
LOOK_EVERY_SECONDS = 1.0  # what changes with time alone (ages, a stale heartbeat) writes nothing
RETRY_MS = 1000        # the browser's reconnect delay after the server ends a stream
BACKOFF_MAX_SECONDS = 10.0
SLOW_LOOK_SECONDS = 1.0
IDLE_SECONDS = 30.0    # with no stream open this long, the listener and pusher stop (the next stream starts them)
CLOSE = object()


def sse(event: str, data: str) -> str:
    """One server-sent event: every line of ``data`` as a ``data:`` line."""
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


@dataclass(eq=False)
class Viewer:
    """One open stream: its lab and the events waiting to be written to it."""
    lab: str
    events: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=QUEUE_EVENTS))

    def offer(self, event) -> bool:
        try:
            self.events.put_nowait(event)
            return True
        except queue.Full:
            return False


@dataclass(eq=False)
class LabFeed:
    """A lab with viewers in this process: them, what was last sent for each panel, when it was looked at."""
    lab: Lab
    viewers: set[Viewer] = field(default_factory=set)
    shown: dict[str, str] = field(default_factory=dict)    # panel -> the fingerprint its last event shows
    events: dict[str, str] = field(default_factory=dict)   # panel -> its last event, for new viewers
    announced: bool = True
    looked_at: float = 0.0
    failing: bool = False


class Hub:
    """This process's listener, pusher and viewers (one per app, started with its first stream)."""

    def __init__(self, app: Flask):
        self.app = app
        self.lock = threading.Lock()
        self.feeds: dict[str, LabFeed] = {}
        self.streams = 0
        self.wake = threading.Event()
        self.stopped = threading.Event()  # this run's threads stop (set when idle: see _push)
        self.started = False
        self.listening = False
        self.pushes = 0  # events put on queues, for the bench and tests
        self.threads: list[threading.Thread] = []  # this run's listener and pusher
        # How long each panel took to load and render last time: a look renders the quick ones first,
        # so that a slow panel (the verdict at scale) holds up no other.
        self.render_seconds: dict[str, float] = {}

    # --- viewers ---

    def subscribe(self, lab: Lab) -> Viewer | None:
        """A new viewer of ``lab`` with every panel as last sent queued; None past the cap."""
        cap = int(self.app.config.get("LIVE_STREAMS_PER_WORKER", 0))
        with self.lock:
            if self.streams >= cap:
                return None
            self.streams += 1
            self._start()
            feed = self.feeds.setdefault(lab.name, LabFeed(lab))
            viewer = Viewer(lab.name)
            for event in feed.events.values():
                viewer.offer(event)
            feed.viewers.add(viewer)
            feed.announced = True  # and look again now: what was last sent may be a second old
        self.wake.set()
        return viewer

    def unsubscribe(self, viewer: Viewer) -> None:
        with self.lock:
            self.streams -= 1
            feed = self.feeds.get(viewer.lab)
            if feed is not None:
                feed.viewers.discard(viewer)
                if not feed.viewers:
                    del self.feeds[viewer.lab]

    def drop(self, lab_name: str) -> int:
        """End every stream of ``lab_name`` (their browsers reconnect); how many were ended."""
        with self.lock:
            viewers = list(self.feeds.get(lab_name, LabFeed(Lab(lab_name))).viewers)
        for viewer in viewers:
            viewer.offer(CLOSE)
        return len(viewers)

    def announce(self, lab_name: str | None = None) -> None:
        """A lab's data changed (None: maybe every lab's, as after a lost connection)."""
        with self.lock:
            for name, feed in self.feeds.items():
                if lab_name is None or name == lab_name:
                    feed.announced = True
        self.wake.set()

    # --- threads ---

    def _start(self) -> None:
        """Start the listener and the pusher, unless they run (call with the lock held)."""
        if self.started:
            return
        self.started, self.stopped = True, threading.Event()
        self.threads = [threading.Thread(target=self._listen, args=(self.stopped,), name="lab-change-listener",
                                         daemon=True),
                        threading.Thread(target=self._push, args=(self.stopped,), name="lab-change-pusher",
                                         daemon=True)]
        for thread in self.threads:
            thread.start()

    def _listen(self, stopped: threading.Event) -> None:
        backoff = 0.5
        conninfo = psycopg_conninfo(self.app.config["DATABASE_URL"])
        while not stopped.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening, backoff = True, 0.5
                    self.announce()  # what changed while no one listened
                    while not stopped.is_set():
                        for notify in conn.notifies(timeout=1.0):
                            self.announce(notify.payload)
            except psycopg.Error as error:
                self.listening = False
                log.warning("lab change feed: %s; listening again in %.1f s", error, backoff)
                self.announce()  # the pusher's once-a-second look carries on meanwhile
                stopped.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    def _push(self, stopped: threading.Event) -> None:
        idle_since = time.monotonic()
        while not stopped.is_set():
            self.wake.wait(0.1)
            self.wake.clear()
            gap = 1.0 / float(self.app.config.get("LIVE_PUSHES_PER_SECOND") or 4.0)
            now = time.monotonic()
            with self.lock:
                if self.feeds:
                    idle_since = now
                elif now - idle_since > IDLE_SECONDS:  # nobody watches: free the connection and threads
                    self.started = False
                    stopped.set()
                    return
                due = [feed for feed in self.feeds.values()
                       if now - feed.looked_at >= (gap if feed.announced else LOOK_EVERY_SECONDS)]
                for feed in due:
                    feed.announced, feed.looked_at = False, now
            for feed in due:
                self._look(feed)

    def _look(self, feed: LabFeed) -> None:
        """Compute the lab's fingerprints once; render each changed panel once and queue it for
        every viewer of the lab as soon as it is rendered (a slow panel holds up no other)."""
        from . import dashboard
        started = time.monotonic()
        try:
            with self.app.test_request_context("/"):
                g.classroom_lab = feed.lab  # the templates' lab, never the request's
                order = sorted(dashboard.PANELS, key=lambda name: self.render_seconds.get(name, 0.0))
                for name, fingerprint, html, took in dashboard.render_pushed(feed.lab, dict(feed.shown), order):
                    self.render_seconds[name] = took
                    self._send(feed, sse(name, html), name, fingerprint)
            if feed.failing:
                feed.failing = False
                self._send(feed, sse("lab-status", "ok"))
            took = time.monotonic() - started
            if took > SLOW_LOOK_SECONDS:  # its viewers see the lab that much later: say so in the log
                log.warning("live panels of lab %s: one look took %.1f s", feed.lab.name, took)
        except Exception as error:  # noqa: BLE001 (the thread serves every lab: it must carry on)
            if isinstance(error, SQLAlchemyError):  # a database away, a lab being reset: look again
                log.warning("live panels of lab %s: %s", feed.lab.name, error)
            else:
                log.exception("live panels of lab %s", feed.lab.name)
            if not feed.failing:
                feed.failing = True
                self._send(feed, sse("lab-status", "the lab's database does not answer"))

    def _send(self, feed: LabFeed, event: str, panel: str | None = None, fingerprint: str = "") -> None:
        """``event`` to every viewer of ``feed``; a panel's is also kept for the viewers to come."""
        with self.lock:
            if panel is not None:
                feed.shown[panel] = fingerprint
                feed.events[panel] = event
            viewers = list(feed.viewers)
        for viewer in viewers:
            if viewer.offer(event):
                self.pushes += 1
            else:
                viewer.events.queue.clear()  # behind by a whole queue: end it, it reconnects
                viewer.offer(CLOSE)


def hub(app: Flask | None = None) -> Hub:
    app = app or current_app._get_current_object()
    with _hubs_lock:
        if EXTENSION not in app.extensions:
            app.extensions[EXTENSION] = Hub(app)
        return app.extensions[EXTENSION]


_hubs_lock = threading.Lock()


def stop_hub(app: Flask, timeout: float = 10.0) -> None:
    """End every stream of ``app``, stop its listener and pusher and wait (up to ``timeout``) until
    they are through: a look still rendering holds a connection of the app's pool, which its
    caller is about to dispose of (a test's app, at its end)."""
    the_hub = app.extensions.get(EXTENSION)
    if the_hub is None:
        return
    with the_hub.lock:
        viewers = [viewer for feed in the_hub.feeds.values() for viewer in feed.viewers]
        the_hub.started = False
        the_hub.stopped.set()
        threads = list(the_hub.threads)
    for viewer in viewers:
        viewer.offer(CLOSE)
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout)


@bp.get("/stream")
def stream():
    """The lab's panels as server-sent events: ``hello``, then one event per changed panel, named
    after it, whose data is the panel's HTML (the chart's: its series as JSON); ``refused`` past the cap."""
    try:
        lab = current_lab()
    except InvalidLabName:
        return Response(sse("refused", "no such lab"), mimetype="text/event-stream")
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    if not current_app.config.get("LIVE_PUSH"):
        return Response(sse("refused", "push is off on this server (LIVE_PUSH=0): this page polls"),
                        mimetype="text/event-stream", headers=headers)
    the_hub = hub()
    viewer = the_hub.subscribe(lab)
    if viewer is None:
        cap = current_app.config.get("LIVE_STREAMS_PER_WORKER")
        return Response(sse("refused", f"this web process holds its most live streams ({cap}, "
                                       "LIVE_STREAMS_PER_WORKER): this page polls once a second instead"),
                        mimetype="text/event-stream", headers=headers)
    lifetime = float(current_app.config.get("LIVE_STREAM_SECONDS") or 300)

    def events():
        try:
            yield f"retry: {RETRY_MS}\n" + sse("hello", lab.name)
            ends = time.monotonic() + lifetime
            while time.monotonic() < ends:
                try:
                    event = viewer.events.get(timeout=KEEPALIVE_SECONDS)
                except queue.Empty:
                    yield ": keep-alive\n\n"
                    continue
                if event is CLOSE:
                    return
                yield event
        finally:
            the_hub.unsubscribe(viewer)
    return Response(events(), mimetype="text/event-stream", headers=headers)
