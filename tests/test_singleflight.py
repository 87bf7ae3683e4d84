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
