"""The dashboard page and its panels render what PostgreSQL holds."""
import pytest
from sqlalchemy import text

from webapp.domain.waits import wait_until
from webapp.web.db import lab_session


def test_page_renders_accounts_from_the_database(app, client, lab):
    with app.app_context(), lab_session(lab.lab.schema) as session:
        session.execute(text("UPDATE accounts SET owner = 'Zélia Projector', balance = 123456 WHERE id = 'acc-4'"))
        session.commit()
    page = client.get("/").get_data(as_text=True)
    assert "Zélia Projector" in page
    assert "1,234.56" in page
    assert lab.lab.topic in page


@pytest.mark.parametrize("panel", ["accounts", "partitions", "consumers", "verdict", "timeline", "dedup", "lanes",
                                   "chart", "sql", "status", "group_controls"])
def test_each_panel_is_served_alone_and_replaces_itself(client, lab, panel):
    response = client.get(f"/panels/{panel}")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert f'id="panel-{panel}"' in html
    assert f'data-live="{panel}"' in html and 'data-fingerprint="' in html
    if panel != "chart":  # the chart keeps its canvas and fetches JSON instead
        assert 'hx-swap="outerHTML"' in html and f'hx-get="/panels/{panel}' in html


def test_partitions_show_published_offsets(client, lab):
    record = lab.credit("acc-2", 500)
    html = client.get("/panels/partitions").get_data(as_text=True)
    assert f'data-partition="{record["partition"]}"' in html
    assert f'data-offset="{record["offset"]}"' in html


def test_unknown_panel_is_a_404_page(client, lab):
    response = client.get("/panels/nope")
    assert response.status_code == 404
    assert "nothing at /panels/nope" in response.get_data(as_text=True)


def test_live_fingerprints_change_only_for_panels_that_changed(client, lab):
    # A fresh lab settles first: the agent has snapshotted the group's committed offsets (the
    # consumers panel's redelivery window reads them); then, while nothing happens, two polls agree.
    group = lab.lab.group_id("payments")
    lab.wait(lambda s: all(group in p["committed"] for p in s["partitions"]),
             "the agent never snapshotted the group's committed offsets")
    seen = [None]

    def settled():
        current = client.get("/live").get_json()["fingerprints"]
        stable, seen[0] = current == seen[0], current
        return stable
    wait_until(settled, timeout=15, interval=0.3, message="the fingerprints never settled")
    before = seen[0]
    lab.credit("acc-1", 700)
    after = client.get("/live").get_json()["fingerprints"]
    for changed in ("partitions", "accounts", "verdict", "timeline", "chart"):
        assert after[changed] != before[changed], changed
    for unchanged in ("consumers", "dedup", "sql", "group_controls"):
        assert after[unchanged] == before[unchanged], unchanged
    # A panel carries the fingerprint it was rendered with, so the page can tell it is current.
    assert f'data-fingerprint="{after["accounts"]}"' in client.get("/panels/accounts").get_data(as_text=True)


def test_chart_series_start_at_zero_and_reach_the_expected_total(client, lab):
    assert client.get("/panels/chart.json").get_json()["x"] == []
    lab.credit("acc-1", 700)
    lab.credit("acc-2", 300)
    data = client.get("/panels/chart.json").get_json()
    series = {s["label"]: s["values"] for s in data["series"]}
    assert series["expected"][0] == 0 and series["expected"][-1] == 1000
    assert series["actual"][-1] == 0  # no consumer yet
    assert len(data["x"]) == len(series["expected"]) == len(series["actual"])


def test_drilldown_of_an_event_and_of_a_record(client, lab):
    record = lab.credit("acc-2", 1234)
    html = client.get(f"/events/{record['event_id']}", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert f"Event {record['event_id']}" in html
    assert f"P{record['partition']} @ {record['offset']}" in html and "+12.34" in html
    assert "Not delivered to any consumer yet" in html and "<html" not in html
    page = client.get(f"/records/{record['partition']}/{record['offset']}").get_data(as_text=True)
    assert "<html" in page and record["event_id"] in page  # without htmx: a whole page
    assert client.get("/events/00000000-0000-4000-8000-00000000abcd").status_code == 404
    assert client.get("/events/not-a-uuid").status_code == 404


def test_sql_view_draws_transactions_and_crash_points(client, lab):
    html = client.get("/panels/sql?strategy=eventid-split").get_data(as_text=True)
    assert html.count('class="boundary begin"') == 2 and html.count('class="boundary commit"') == 2
    assert 'data-point="between-key-and-effect"' in html
    assert "ON CONFLICT (event_id) DO NOTHING" in html
    assert 'hx-get="/panels/sql?strategy=eventid-split"' in html  # a chosen tab stays chosen
    html = client.get("/panels/sql").get_data(as_text=True)
    assert 'class="tab current" aria-pressed="true"' in html and 'data-strategy="none"' in html


def test_viewers_polling_at_once_share_one_fingerprint_computation_and_one_panel_load(app_factory, lab_name, lab,
                                                                                        monkeypatch):
    """Forty viewers of one lab: /live computes the fingerprints once per LIVE_CACHE_SECONDS, and a
    changed panel is loaded once for all of them (the others wait for that load), on real PostgreSQL."""
    import threading

    from webapp.readmodel import fingerprints
    from webapp.readmodel import verdict as verdict_module
    from webapp.web import panel_cache

    lab.credit("acc-1", 100)
    app = app_factory(LAB_NAME=lab_name, LIVE_CACHE_SECONDS=30)
    counted = {"fingerprints": 0, "verdict": 0}
    real_parts, real_verdict = fingerprints.fingerprint_parts, verdict_module.verdict

    def counting(name, real):
        def call(*args, **kwargs):
            counted[name] += 1
            return real(*args, **kwargs)
        return call
    monkeypatch.setattr(fingerprints, "fingerprint_parts", counting("fingerprints", real_parts))
    monkeypatch.setattr(verdict_module, "verdict", counting("verdict", real_verdict))
    panel_cache.fingerprint_cache.clear()
    panel_cache.load_cache.clear()

    answers, barrier = [], threading.Barrier(20)

    def viewer():
        client = app.test_client()
        barrier.wait(10)
        answers.append((client.get("/live").status_code, client.get("/panels/verdict").status_code))
    threads = [threading.Thread(target=viewer) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [(200, 200)] * 20
    assert counted == {"fingerprints": 1, "verdict": 1}, counted
    # Past the window a new computation; without one (LIVE_CACHE_SECONDS=0) one per request.
    uncached = app_factory(LAB_NAME=lab_name, LIVE_CACHE_SECONDS=0).test_client()
    uncached.get("/live")
    uncached.get("/live")
    assert counted["fingerprints"] == 3


@pytest.mark.parametrize("panel", ["accounts", "verdict", "lanes"])
def test_a_slow_panel_is_served_at_once_from_its_last_load_marked_stale_then_refreshed(app_factory, lab_name, lab,
                                                                                          panel):
    """At scale (LIVE_STALE_AFTER_SECONDS; here every load counts as slow): after a change the panel
    answers with its last load, says so and carries that load's fingerprint, so the page asks again;
    a background thread, with its own app context and session, loads it for the new state."""
    import re

    from webapp.web import panel_cache

    app = app_factory(LAB_NAME=lab_name, LIVE_STALE_AFTER_SECONDS=1e-9)
    client = app.test_client()
    panel_cache.load_cache.clear()

    def fingerprint(html: str) -> str:
        return re.search(r'data-fingerprint="([^"]*)"', html).group(1)

    def without_note(html: str) -> str:
        return " ".join(re.sub(r'<p class="stale".*?</p>', "", html, flags=re.S).split())

    first = client.get(f"/panels/{panel}").get_data(as_text=True)
    assert "data-stale" not in first, "nothing was kept yet: the first load is the request's own"
    lab.credit("acc-1", 700)
    wait_until(lambda: client.get("/live").get_json()["fingerprints"][panel] != fingerprint(first), timeout=30,
               message=f"the {panel} panel's fingerprint never changed after a credit")

    stale = client.get(f"/panels/{panel}")
    html = stale.get_data(as_text=True)
    assert stale.status_code == 200 and "data-stale" in html and "Updating: this shows the lab as it was" in html
    assert fingerprint(html) == fingerprint(first), "a stale panel must carry the fingerprint of what it shows"
    assert without_note(html) == without_note(first), "a stale panel shows its last load as it was"

    def refreshed():
        html = client.get(f"/panels/{panel}").get_data(as_text=True)
        return "data-stale" not in html and html
    fresh = wait_until(refreshed, timeout=30, interval=0.1, message=f"the {panel} panel was never loaded again")
    assert fingerprint(fresh) != fingerprint(first)
    if panel in ("accounts", "lanes"):  # lanes shows the accounts' expected balances: never an older load's
        assert "7.00" in fresh and "7.00" not in first


def test_a_large_dedup_table_shows_the_catalogs_estimate_marked_as_one(app, client, lab):
    with app.app_context(), lab_session(lab.lab.schema) as session:
        session.execute(text("INSERT INTO processed_events (event_id) "
                             "SELECT gen_random_uuid() FROM generate_series(1, 120000)"))
        session.execute(text("ANALYZE processed_events"))
        session.execute(text("INSERT INTO seen_events (event_id) VALUES (gen_random_uuid())"))
        session.commit()
    html = client.get("/panels/dedup").get_data(as_text=True)
    large = html.split('data-table="processed_events"', 1)[1].split('data-table=', 1)[0]
    small = html.split('data-table="seen_events"', 1)[1].split('data-table=', 1)[0]
    assert "<b data-count>~1" in large and "an estimate: the catalog's row count" in large
    assert "<b data-count>1</b>" in small and "an estimate" not in small
