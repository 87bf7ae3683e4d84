"""The instructor's class board: one card per attendee, kept current for every board at once.

A card has cheap parts, read for the whole class in three queries at every look (who joined, their
newest guided run, how many consumers run), and a costly one, read in the attendee's lab: the
verdict (the graded lane's for a grading exercise), the stalled groups, the lab's last activity.
Thirty labs' verdicts on every request made the board the slowest page of a class, so
the costly part is kept per lab and read again only when it may have changed:

- the lab was announced on the change feed since it was read (web/push.py's stamps: every writer
  of a lab's data announces it at commit), or it was read for another lane (a grading exercise,
  once prepared, is judged on the learner's lane);
- or it is older than CORE_MAX_AGE_SECONDS: a group stalls with time alone, which writes nothing.

A part younger than CORE_FRESH_SECONDS is used as it is, changed or not: a class in full swing
announces every lab every second, and the board would read them all at every look.

Who reads: the hub's pusher, at each look at the board (once a second while a board is open or was
asked for in the last IDLE_SECONDS). A request for the page or its polling fallback uses the
parts as the pusher last read them and reads only a lab it has none of yet (or whose graded lane changed):
it answers as fast as the cheap queries, never behind thirty verdicts. So a card may be a look
behind its lab; one whose lab changed since its part was read more than BEHIND_SHOWN_SECONDS ago
says how old its verdict is (``behind_seconds``: the board reads slower than the class changes).
The results export reads every changed lab itself: a file has no such marks.

One board per class code and web process, kept by the hub (``Hub.keep``) while a board is open or
was asked for lately, so its pusher reads the changed labs in the background once a second and a
request rarely waits for one. The instructor's pages stream it (``GET /class/stream``, event
``board``) or poll ``GET /class/cards`` when push is unavailable.
"""
from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from flask import current_app, render_template
from markupsafe import Markup
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from ..domain.lab import Lab
from ..readmodel import group_health, service_health
from ..readmodel import verdict as verdict_readmodel
from ..scenarios import ScenarioError, built_in, load
from ..scenarios.loader import Scenario
from ..scenarios.runner import RunState
from ..store import classroom
from ..store.schema import enter
from . import push
from .db import db, lab_session
from .singleflight import SingleFlight

BOARD_LOCK_TIMEOUT = "200ms"
# A look reads the labs' parts this many at once. A read is mostly waiting for PostgreSQL's answers
# (bench/classroom.py at 30 attendees, py-spy: 96% of the pusher's look in psycopg's wait), so
# thirty labs read one after the other made a look last about 30 s: the board changed twice a
# minute. A few connections of the process's pool (5 + 10 overflow), never most of it. Only the
# pusher's looks use them.
BOARD_READERS = 4
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()
CORE_FRESH_SECONDS = 2.0     # a lab's verdict this young is shown as it is
CORE_MAX_AGE_SECONDS = 10.0  # ...and one this old is read again, changed or not (a group stalls with time)
BEHIND_SHOWN_SECONDS = 3.0   # a card further behind its lab than this says so
UNCHANGED, CHANGED, UNKNOWN = "unchanged", "changed", "unknown"  # a lab since its part was read


@lru_cache(maxsize=64)
def _parsed(path: Path, modified: float) -> Scenario:
    return load(path)


def exercise(name: str) -> Scenario | None:
    """A built-in exercise by name, parsed once per version of its file (the board and the
    presenter ask every second; parsing all of them takes about a second). None when there is no
    such file, or it does not load: a card then names the run's exercise by its file, and the
    Exercises page shows the error."""
    path = next((p for p in built_in() if p.stem == name), None)
    try:
        return _parsed(path, path.stat().st_mtime) if path else None
    except ScenarioError:
        return None


def exercises() -> list[tuple[str, str]]:
    """(name, title) of each built-in exercise that loads: what the board can start for everyone."""
    loaded = ((path.stem, exercise(path.stem)) for path in built_in())
    return [(name, scenario.title) for name, scenario in loaded if scenario is not None]


@dataclass(frozen=True)
class LabPart:
    """The costly part of a card, read in the attendee's lab."""
    verdict: str
    duplicates_applied: int | None
    effects_lost: int | None
    stalled_groups: list[dict[str, Any]]
    active_at: float | None  # wall-clock time of the lab's newest timeline entry
    read_at: float           # wall-clock time it was read


def readers() -> ThreadPoolExecutor:
    """The process's board readers, created on first use (after gunicorn forked its worker)."""
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(max_workers=BOARD_READERS, thread_name_prefix="board-read")
        return _readers


def read_lab_part(lab: Lab, graded_lane: str | None) -> LabPart:
    """The verdict (the graded lane's for a grading exercise), stalled groups and last activity of
    ``lab``; "unavailable" when the lab cannot be read at once (being reset or dropped)."""
    read_at = time.time()
    with db.engine.connect() as conn:
        idle = classroom.idle_seconds(conn, lab, BOARD_LOCK_TIMEOUT)
    try:
        with lab_session(lab.schema) as session_:
            # The board must never hold up (or deadlock with) a lab being reset or dropped: a
            # lock it cannot get at once makes the card say "unavailable" until the next look.
            session_.execute(text(f"SET LOCAL lock_timeout = '{BOARD_LOCK_TIMEOUT}'"))
            stalled_groups = group_health.stalled(session_, lab)
            if graded_lane:
                enter(session_.connection(), lab.lane_schema(graded_lane))
            verdict = verdict_readmodel.verdict(session_, lab.schema, explain=False)  # a card shows counts, not the whys
    except SQLAlchemyError:
        return LabPart("unavailable", None, None, [], None if idle is None else read_at - idle, read_at)
    return LabPart(verdict.status, verdict.duplicates_applied, verdict.effects_lost, stalled_groups,
                   None if idle is None else read_at - idle, read_at)


class ClassBoard(push.Source):
    """The cards of one class, for the board's page, its stream and the results export."""
    gap = 1.0  # at most one look a second, however many labs are announced

    def __init__(self, code: str, hub: push.Hub):
        self.key, self.code, self.hub = f"class:{code}", code, hub
        self.parts = SingleFlight()  # lab -> (its stamp, its run, LabPart)

    def concerns(self, lab_name: str) -> bool:
        return True  # any lab may be an attendee's, or one's who is joining

    def cards(self, read_changed: bool = False) -> list[dict[str, Any]]:
        """One card per attendee of this class: exercise and step, verdict, consumers, last activity.
        ``read_changed`` (the pusher): read again each lab part that may have changed; else only
        the missing ones."""
        with db.engine.connect() as conn:
            people = classroom.attendees(conn, self.code)
            labs = [person.lab for person in people]
            runs = classroom.latest_runs(conn, labs)
            consumers = classroom.live_consumers(conn, labs)
        guided = []  # per attendee: their newest run, its exercise, its progress, the lane it grades
        for person in people:
            run = runs.get(person.lab)
            scenario = exercise(run["scenario"]) if run else None
            progress = RunState.from_dict(run["progress"]) if run else None
            # A grading exercise judges the learner's own consumer: its lane's verdict, once prepared.
            graded_lane = scenario.outside_lane if scenario and progress and progress.prepared else None
            guided.append((run, scenario, progress, graded_lane))
        app = current_app._get_current_object()

        def lab_part(person, graded_lane) -> tuple[LabPart, str]:
            with app.app_context():  # a reader thread: Flask-SQLAlchemy's engine is the app's
                return self._lab_part(Lab(person.lab), graded_lane, read_changed)
        # The pusher's look reads on the readers; a request uses the parts it keeps (reading only a
        # lab it has none of) in its own thread, never queued behind a look's reads.
        parts = list((readers().map if read_changed else map)(lab_part, people, [lane for *_, lane in guided]))
        now = time.time()
        result = []
        for person, (run, scenario, progress, graded_lane), (part, since) in zip(people, guided, parts):
            quiet = [t for t in (None if part.active_at is None else now - part.active_at,
                                 person.seen_seconds_ago) if t is not None]
            behind = 0.0 if since == UNCHANGED else now - part.read_at
            result.append({
                "name": person.name, "lab": person.lab, "joined_at": person.joined_at,
                "exercise": scenario.title if scenario else (run["scenario"] if run else None),
                "run_id": run["id"] if run else None, "run_status": run["status"] if run else None,
                "step": progress.position if progress else None,
                "steps": len(scenario.steps) if scenario else None,
                "verdict": part.verdict,
                "duplicates_applied": part.duplicates_applied,
                "effects_lost": part.effects_lost,
                "consumers": consumers.get(person.lab, 0),
                "idle_seconds": round(max(0.0, min(quiet)), 1) if quiet else None,
                "stalled_groups": part.stalled_groups,
                "graded_lane": graded_lane,
                "behind_seconds": round(behind, 1) if behind > BEHIND_SHOWN_SECONDS else None,
                "changed_since": since == CHANGED,  # else unknown: the listener was not listening
            })
        return result

    def _lab_part(self, lab: Lab, graded_lane: str | None, read_changed: bool) -> tuple[LabPart, str]:
        """The lab's part, read again if it is missing, it was read for another lane, or
        (``read_changed``) it may be out of date; and what is known of the lab since it was read:
        UNCHANGED, CHANGED or UNKNOWN (the listener does not listen).

        Not keyed on the run: the part is the lab's data (or the graded lane's), which starting a
        run does not change. Thirty attendees starting an exercise at once would otherwise make
        the next board request read thirty verdicts before it answers."""
        stamp = self.hub.stamp(lab.name)  # before the read: a change committed meanwhile moves it

        def valid(kept) -> bool:
            kept_stamp, kept_lane, part = kept
            age = time.time() - part.read_at
            if kept_lane != graded_lane:
                return False
            return not read_changed or age < CORE_FRESH_SECONDS or (
                stamp is not None and kept_stamp == stamp and age < CORE_MAX_AGE_SECONDS)
        def read() -> tuple[tuple, tuple]:
            kept = (stamp, graded_lane, read_lab_part(lab, graded_lane))
            return kept, kept  # (what validity is judged on, the value): the same here
        kept_stamp, _lane, part = self.parts.get(lab.name, valid, read)
        if stamp is None or kept_stamp is None:
            return part, UNKNOWN
        return part, UNCHANGED if kept_stamp == stamp else CHANGED

    def render(self, shown):
        started = time.monotonic()
        html = cards_html(self, read_changed=True)
        digest = hashlib.blake2b(html.encode(), digest_size=12).hexdigest()
        if digest != shown.get("board"):
            yield "board", digest, html, time.monotonic() - started


def down_parts() -> list[dict[str, Any]]:
    """The parts every lab depends on that are down (readmodel/service_health.py), for the board's
    header; PostgreSQL itself when it does not answer."""
    try:
        with db.engine.connect() as conn:
            return service_health.down(service_health.service_health(conn, None))
    except OperationalError as error:
        return service_health.down(
            service_health.database_unreachable(service_health.driver_error(error)))


def cards_html(board: ClassBoard, read_changed: bool = False) -> Markup:
    """The board's cards under the parts that are down, as HTML the board page includes. Without
    PostgreSQL, the header alone (the cards are read from it)."""
    down = down_parts()
    database_down = any(part["part"] == service_health.POSTGRES for part in down)
    return Markup(render_template("classroom/_cards.html",  # noqa: S704 (our own template's output)
                                  cards=[] if database_down else board.cards(read_changed), down=down))


def class_board() -> ClassBoard:
    """This process's board of the configured class, kept warm a while longer by this request."""
    the_hub = push.hub()
    return the_hub.keep(ClassBoard(classroom.class_code(current_app.config), the_hub))
