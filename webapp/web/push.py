"""Live panels pushed over server-sent events: one stream per open page.

Polling cost viewers × changes: every page asked each second and fetched each changed panel.
Pushing costs changes: per web process,

- one thread LISTENs on ``lab_change`` (store/lab_changes.py: every writer of a lab's data
  announces its lab at commit) on one psycopg connection, reconnecting with backoff;
- one thread looks at each feed that has viewers here when a lab it shows was announced, and once
  a second anyway (an agent's heartbeat growing old writes nothing), at most
  LIVE_PUSHES_PER_SECOND times a second per feed: it renders each changed panel once with its
  partial template and puts the same event on every viewer's queue;
- each stream is one request thread of the worker (gunicorn gthread) that waits on its queue.

A feed is what one kind of page shows (a ``Source``): a lab's dashboard panels (``LabPanels``,
``GET /stream``), a guided run's step and live panel, the presenter's step line (``Partials``,
pages of their own blueprints), the class board (web/board.py). A page's stream may carry several
(the presenter: its lab's panels and its step line). A feed can also be *kept* without viewers for
a while (``Hub.keep``): the board's cards stay warm for the requests that poll it.

A new stream (a reconnect too) gets every panel as last rendered for its feeds at once, and they
are looked at again right away. Limits: LIVE_STREAMS_PER_WORKER streams per process; past it the
stream answers one ``refused`` event with the reason and ends, and the page polls, saying so. A
viewer too slow to take its events (a full queue) has its stream ended; its browser reconnects and
gets the current state. A viewer costs a thread (its stack is mostly untouched virtual memory), a
queue of at most QUEUE_EVENTS events and a socket; the panels' HTML is shared.

Access: the stream is the request's lab (access.current_lab), as every page: in classroom mode an
attendee's own lab, or the one the instructor or a permitted attendee views read-only.
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import psycopg
from flask import Blueprint, Flask, Response, current_app, g
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import InvalidLabName, Lab
from ..store.connection import psycopg_conninfo, with_reconnect_backoff
from ..store.lab_changes import CHANNEL
from .access import current_lab, stream_guard
from .security import browser_id

bp = Blueprint("push", __name__)
log = logging.getLogger(__name__)

EXTENSION = "lab_push"
QUEUE_EVENTS = 256     # a viewer this far behind is cut off (it reconnects and gets the current state)
KEEPALIVE_SECONDS = 10.0  # a comment line this often: proxies keep the stream, a gone browser is noticed
LOOK_EVERY_SECONDS = 1.0  # what changes with time alone (ages, a stale heartbeat) writes nothing
RETRY_MS = 1000        # the browser's reconnect delay after the server ends a stream
SLOW_LOOK_SECONDS = 1.0
IDLE_SECONDS = 30.0    # with no stream open this long, the listener and pusher stop (the next stream starts them)
CLOSE = object()


def sse(event: str, data: str) -> str:
    """One server-sent event: every line of ``data`` as a ``data:`` line."""
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


class Source:
    """What a feed shows: its key (one feed per key per process), the lab its templates name (None:
    several labs, as the board), which labs' announcements concern it, and its events.

    ``gap``: the least time between two looks (None: 1 / LIVE_PUSHES_PER_SECOND)."""
    key: str = ""
    lab: Lab | None = None
    gap: float | None = None

    def concerns(self, lab_name: str) -> bool:
        return self.lab is not None and lab_name == self.lab.name

    def render(self, shown: dict[str, str]) -> Iterator[tuple[str, str, str, float]]:
        """Each event whose fingerprint differs from ``shown[event]``, as ``(event, fingerprint,
        data, seconds it took)``, as soon as it is rendered. Runs in a request context whose ``g``
        names the lab and says the HTML is pushed (``g.pushed``: no viewer's CSRF token in it)."""
        raise NotImplementedError


class LabPanels(Source):
    """A lab's dashboard panels: fingerprints computed once a look, each changed panel loaded and
    rendered once (panels.render_pushed), the quickest first so that a slow panel (the verdict
    at scale) holds up no other."""

    def __init__(self, lab: Lab, render_seconds: dict[str, float]):
        self.key, self.lab, self.render_seconds = f"lab:{lab.name}", lab, render_seconds

    def render(self, shown):
        from . import panels
        order = sorted(panels.PANELS, key=lambda name: self.render_seconds.get(name, 0.0))
        for name, fingerprint, html, took in panels.render_pushed(self.lab, shown, order):
            self.render_seconds[name] = took
            yield name, fingerprint, html, took


class Partials(Source):
    """Partial templates rendered whole at each look and sent when their HTML changed (its digest is
    the fingerprint): for what is cheap to render once a second for every viewer at once (a guided
    run's step and live panel, the presenter's step line)."""

    def __init__(self, key: str, lab: Lab, partials: dict[str, Callable[[], str]]):
        self.key, self.lab, self.partials = key, lab, partials

    def render(self, shown):
        for name, render in self.partials.items():
            started = time.monotonic()
            html = render()
            digest = hashlib.blake2b(html.encode(), digest_size=12).hexdigest()
            if digest != shown.get(name):
                yield name, digest, html, time.monotonic() - started


@dataclass(eq=False)
class Viewer:
    """One open stream: the feeds it shows and the events waiting to be written to it."""
    keys: tuple[str, ...]
    browser: str = ""  # the browser session's id (security.browser_id): its streams are capped
    events: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=QUEUE_EVENTS))

    def offer(self, event) -> bool:
        try:
            self.events.put_nowait(event)
            return True
        except queue.Full:
            return False


@dataclass(eq=False)
class Feed:
    """A source with viewers in this process (or kept): them, what was last sent for each event,
    when it was looked at."""
    source: Source
    viewers: set[Viewer] = field(default_factory=set)
    shown: dict[str, str] = field(default_factory=dict)    # event -> the fingerprint it last showed
    events: dict[str, str] = field(default_factory=dict)   # event -> its last one, for new viewers
    announced: bool = True
    looked_at: float = 0.0
    failing: bool = False
    kept_until: float = 0.0  # looked at without viewers until then (Hub.keep)

    def wanted(self, now: float) -> bool:
        return bool(self.viewers) or now < self.kept_until


class Hub:
    """This process's listener, pusher and viewers (one per app, started with its first stream)."""

    def __init__(self, app: Flask):
        self.app = app
        self.lock = threading.Lock()
        self.feeds: dict[str, Feed] = {}
        self.streams = 0
        self.browser_streams: dict[str, int] = {}  # a browser session's id -> its open streams here
        self.wake = threading.Event()
        self.stopped = threading.Event()  # this run's threads stop (set when idle: see _push)
        self.started = False
        self.listening = False
        self.pushes = 0  # events put on queues, for the bench and tests
        self.threads: list[threading.Thread] = []  # this run's listener and pusher
        # How long each dashboard panel took to load and render last time (LabPanels' order).
        self.render_seconds: dict[str, float] = {}
        # What the listener heard, for caches of what a lab's data decides (the board's cards): a
        # lab's count of announcements, and an epoch bumped whenever the listener may have missed
        # some (it connected, or lost its connection).
        self.changes: dict[str, int] = {}
        self.epoch = 0

    def stamp(self, lab_name: str) -> tuple[int, int] | None:
        """What the listener heard of ``lab_name`` so far: equal stamps mean no change was committed
        in between. None while it does not listen (then nothing can be known unchanged)."""
        return (self.epoch, self.changes.get(lab_name, 0)) if self.listening else None

    # --- viewers ---

    def subscribe(self, sources: list[Source], browser: str = "") -> Viewer | None:
        """A new viewer of ``sources`` with every event as last sent queued; None past the process's
        cap or the browser's (LIVE_STREAMS_PER_WORKER, LIVE_STREAMS_PER_BROWSER)."""
        cap = int(self.app.config.get("LIVE_STREAMS_PER_WORKER", 0))
        browser_cap = int(self.app.config.get("LIVE_STREAMS_PER_BROWSER", 0)) or cap
        with self.lock:
            if self.streams >= cap or self.browser_streams.get(browser, 0) >= browser_cap:
                return None
            self.streams += 1
            self.browser_streams[browser] = self.browser_streams.get(browser, 0) + 1
            self._start()
            viewer = Viewer(tuple(source.key for source in sources), browser)
            for source in sources:
                feed = self.feeds.setdefault(source.key, Feed(source))
                for event in feed.events.values():
                    viewer.offer(event)
                feed.viewers.add(viewer)
                feed.announced = True  # and look again now: what was last sent may be a second old
        self.wake.set()
        return viewer

    def refusal(self, browser: str) -> str:
        """Why :meth:`subscribe` refused this browser a stream: its own cap, or the process's."""
        browser_cap = int(self.app.config.get("LIVE_STREAMS_PER_BROWSER", 0))
        if browser_cap and self.browser_streams.get(browser, 0) >= browser_cap:
            return (f"this browser holds its most live streams ({browser_cap}, LIVE_STREAMS_PER_BROWSER): "
                    "this page polls once a second instead")
        return (f"this web process holds its most live streams ({self.app.config.get('LIVE_STREAMS_PER_WORKER')}, "
                "LIVE_STREAMS_PER_WORKER): this page polls once a second instead")

    def keep(self, source: Source, seconds: float = IDLE_SECONDS) -> Source:
        """Look at ``source`` for ``seconds`` more even without viewers; the source this process
        already keeps under its key if there is one (with what it has cached)."""
        with self.lock:
            self._start()
            feed = self.feeds.setdefault(source.key, Feed(source))
            feed.kept_until = max(feed.kept_until, time.monotonic() + seconds)
            return feed.source

    def unsubscribe(self, viewer: Viewer) -> None:
        with self.lock:
            self.streams -= 1
            left = self.browser_streams.get(viewer.browser, 0) - 1
            if left > 0:
                self.browser_streams[viewer.browser] = left
            else:
                self.browser_streams.pop(viewer.browser, None)
            for key in viewer.keys:
                feed = self.feeds.get(key)
                if feed is not None:
                    feed.viewers.discard(viewer)
                    if not feed.wanted(time.monotonic()):
                        del self.feeds[key]

    def drop(self, lab_name: str) -> int:
        """End every stream showing ``lab_name`` (their browsers reconnect); how many were ended."""
        with self.lock:
            viewers = {viewer for feed in self.feeds.values()
                       if feed.source.lab is not None and feed.source.lab.name == lab_name for viewer in feed.viewers}
        for viewer in viewers:
            viewer.offer(CLOSE)
        return len(viewers)

    def announce(self, lab_name: str | None = None) -> None:
        """A lab's data changed (None: maybe every lab's, as after a lost connection)."""
        with self.lock:
            if lab_name is None:
                self.epoch += 1
            else:
                self.changes[lab_name] = self.changes.get(lab_name, 0) + 1
            for feed in self.feeds.values():
                if lab_name is None or feed.source.concerns(lab_name):
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
        conninfo = psycopg_conninfo(self.app.config["DATABASE_URL"])

        def listening() -> psycopg.Connection:
            conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=3)
            try:
                conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error:
                conn.close()
                raise
            return conn

        while not stopped.is_set():
            conn = with_reconnect_backoff(listening, going_on=lambda: not stopped.is_set(), sleep=stopped.wait)
            if conn is None:
                break
            with conn:
                try:
                    self.announce()  # what changed while no one listened (a new epoch)...
                    self.listening = True  # ...before a stamp is handed out
                    while not stopped.is_set():
                        for notify in conn.notifies(timeout=1.0):
                            self.announce(notify.payload)
                except psycopg.Error as error:
                    log.warning("lab change feed: %s; listening again", error)
                finally:
                    self.listening = False
            self.announce()  # the pusher's once-a-second look carries on meanwhile

    def _push(self, stopped: threading.Event) -> None:
        idle_since = time.monotonic()
        while not stopped.is_set():
            self.wake.wait(0.1)
            self.wake.clear()
            default_gap = 1.0 / float(self.app.config.get("LIVE_PUSHES_PER_SECOND") or 4.0)
            now = time.monotonic()
            with self.lock:
                for key in [key for key, feed in self.feeds.items() if not feed.wanted(now)]:
                    del self.feeds[key]  # kept, and no longer: nobody asked for it lately
                if self.feeds:
                    idle_since = now
                elif now - idle_since > IDLE_SECONDS:  # nobody watches: free the connection and threads
                    self.started = False
                    stopped.set()
                    return
                due = [feed for feed in self.feeds.values()
                       if now - feed.looked_at >= (max(feed.source.gap or default_gap, default_gap)
                                                   if feed.announced else LOOK_EVERY_SECONDS)]
                for feed in due:
                    feed.announced, feed.looked_at = False, now
            for feed in due:
                self._look(feed)

    def _look(self, feed: Feed) -> None:
        """Render each changed event of the feed once and queue it for every viewer as soon as it
        is rendered (a slow panel holds up no other)."""
        started = time.monotonic()
        try:
            with self.app.test_request_context("/"):
                if feed.source.lab is not None:
                    g.classroom_lab = feed.source.lab  # the templates' lab, never the request's
                g.pushed = True
                for name, fingerprint, data, _took in feed.source.render(dict(feed.shown)):
                    self._send(feed, sse(name, data), name, fingerprint)
            if feed.failing:
                feed.failing = False
                self._send(feed, sse("lab-status", "ok"))
            took = time.monotonic() - started
            if took > SLOW_LOOK_SECONDS:  # its viewers see the lab that much later: say so in the log
                log.warning("live panels of %s: one look took %.1f s", feed.source.key, took)
        except Exception as error:  # noqa: BLE001 (the thread serves every feed: it must carry on)
            if isinstance(error, SQLAlchemyError):  # a database away, a lab being reset: look again
                log.warning("live panels of %s: %s", feed.source.key, error)
            else:
                log.exception("live panels of %s", feed.source.key)
            if not feed.failing:
                feed.failing = True
                self._send(feed, sse("lab-status", "the lab's database does not answer"))

    def _send(self, feed: Feed, event: str, name: str | None = None, fingerprint: str = "") -> None:
        """``event`` to every viewer of ``feed``; a named one is also kept for the viewers to come."""
        with self.lock:
            if name is not None:
                feed.shown[name] = fingerprint
                feed.events[name] = event
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
        viewers = {viewer for feed in the_hub.feeds.values() for viewer in feed.viewers}
        the_hub.started = False
        the_hub.stopped.set()
        threads = list(the_hub.threads)
    for viewer in viewers:
        viewer.offer(CLOSE)
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout)


HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def refused(reason: str) -> Response:
    """A stream of one ``refused`` event: the page closes it for good and polls, showing why."""
    return Response(sse("refused", reason), mimetype="text/event-stream", headers=HEADERS)


def stream_of(sources: list[Source], hello: str) -> Response:
    """A page's stream of ``sources``' events: ``hello``, each feed's events as last rendered, then
    each change; ``refused`` with the reason when push is off or past the cap. The caller has
    checked that the session may read what the sources show."""
    if not current_app.config.get("LIVE_PUSH"):
        return refused("push is off on this server (LIVE_PUSH=0): this page polls")
    the_hub = hub()
    still_allowed = stream_guard()
    viewer = the_hub.subscribe(sources, browser_id())
    if viewer is None:
        return refused(the_hub.refusal(browser_id()))
    lifetime = float(current_app.config.get("LIVE_STREAM_SECONDS") or 300)

    def events():
        try:
            yield f"retry: {RETRY_MS}\n" + sse("hello", hello)
            ends = time.monotonic() + lifetime
            while time.monotonic() < ends:
                try:
                    event = viewer.events.get(timeout=KEEPALIVE_SECONDS)
                except queue.Empty:
                    event = ": keep-alive\n\n"
                if event is CLOSE:
                    return
                if not still_allowed():
                    yield sse("refused", "this browser was signed out of its lab: reload the page")
                    return
                yield event
        finally:
            the_hub.unsubscribe(viewer)
    return Response(events(), mimetype="text/event-stream", headers=HEADERS)


def lab_panels(lab: Lab) -> LabPanels:
    return LabPanels(lab, hub().render_seconds)


@bp.get("/stream")
def stream():
    """The lab's panels as server-sent events: ``hello``, then one event per changed panel, named
    after it, whose data is the panel's HTML (the chart's: its series as JSON); ``refused`` past the cap."""
    try:
        lab = current_lab()
    except InvalidLabName:
        return refused("no such lab")
    return stream_of([lab_panels(lab)], lab.name)
