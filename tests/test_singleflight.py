"""SingleFlight (webapp/web/singleflight.py): one computation per key at a time, shared by threads."""
from __future__ import annotations

import threading

import pytest

from webapp.web.singleflight import SingleFlight


def test_threads_asking_at_once_share_one_computation():
    flight = SingleFlight()
    started, release = threading.Event(), threading.Event()
    calls = []

    def compute():
        calls.append(1)
        started.set()
        assert release.wait(10), "the test never released the computation"
        return "fp-1", "data"

    results = []
    threads = [threading.Thread(target=lambda: results.append(flight.get("k", lambda tag: tag == "fp-1", compute)))
               for _ in range(8)]
    threads[0].start()
    assert started.wait(10), "the first thread never started computing"
    for thread in threads[1:]:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert results == ["data"] * 8 and len(calls) == 1


@pytest.mark.parametrize("wanted, computations", [("fp-1", 1), ("fp-2", 2)])
def test_a_value_is_reused_only_while_it_is_valid_for_the_caller(wanted, computations):
    flight = SingleFlight()
    calls = []

    def compute(tag):
        calls.append(tag)
        return tag, f"data for {tag}"

    assert flight.get("k", lambda tag: tag == "fp-1", lambda: compute("fp-1")) == "data for fp-1"
    assert flight.get("k", lambda tag: tag == wanted, lambda: compute(wanted)) == f"data for {wanted}"
    assert len(calls) == computations
    # Other keys are apart.
    assert flight.get("other", lambda tag: True, lambda: compute("x")) == "data for x"


def test_a_failed_computation_is_raised_to_its_caller_and_the_next_one_tries_again():
    flight = SingleFlight()

    def broken():
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError, match="went away"):
        flight.get("k", lambda tag: True, broken)
    assert flight.get("k", lambda tag: True, lambda: ("t", "back")) == "back"


class CountingExecutor:
    """Runs what it is given on a thread of its own, and counts the submissions."""

    def __init__(self) -> None:
        self.submitted = 0
        self.threads: list[threading.Thread] = []

    def submit(self, function, *args):
        self.submitted += 1
        thread = threading.Thread(target=function, args=args)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive(), "a background computation never ended"


def test_a_fast_computation_is_never_served_stale():
    flight, executor = SingleFlight(), CountingExecutor()
    for tag in ("fp-1", "fp-2"):
        answer = flight.get_or_stale("k", tag, lambda: f"data for {tag}", slow=3600, executor=executor,
                                     compute_apart=lambda: "never")
        assert answer.value == f"data for {tag}" and answer.tag == tag and answer.stale_for is None
    assert executor.submitted == 0


def test_a_slow_one_answers_with_the_last_value_and_recomputes_once_in_the_background():
    flight, executor = SingleFlight(), CountingExecutor()
    release = threading.Event()
    slow = 1e-9  # every computation takes longer than this

    first = flight.get_or_stale("k", "fp-1", lambda: "old", slow=slow, executor=executor, compute_apart=lambda: "x")
    assert first.value == "old" and first.stale_for is None and executor.submitted == 0

    def apart():
        assert release.wait(10), "the test never released the background computation"
        return "new"
    answers = [flight.get_or_stale("k", "fp-2", lambda: "in the request", slow=slow, executor=executor,
                                   compute_apart=apart) for _ in range(5)]
    assert {(a.value, a.tag) for a in answers} == {("old", "fp-1")}
    assert all(a.stale_for is not None and a.stale_for >= 0 for a in answers)
    assert executor.submitted == 1, "one background computation per key at a time"
    release.set()
    executor.join()
    answer = flight.get_or_stale("k", "fp-2", lambda: "in the request", slow=slow, executor=executor,
                                 compute_apart=apart)
    assert (answer.value, answer.tag, answer.stale_for) == ("new", "fp-2", None)


def test_a_failed_background_computation_leaves_the_next_request_to_meet_the_error(caplog):
    flight, executor = SingleFlight(), CountingExecutor()
    flight.get_or_stale("k", "fp-1", lambda: "old", slow=1e-9, executor=executor, compute_apart=lambda: "x")

    def broken():
        raise RuntimeError("the database went away")
    stale = flight.get_or_stale("k", "fp-2", broken, slow=1e-9, executor=executor, compute_apart=broken)
    assert stale.value == "old" and stale.stale_for is not None
    executor.join()
    assert "recomputing fp-2 in the background failed" in caplog.text
    with pytest.raises(RuntimeError, match="went away"):
        flight.get_or_stale("k", "fp-2", broken, slow=1e-9, executor=executor, compute_apart=broken)
