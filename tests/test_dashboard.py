"""The dashboard page and its panels render what PostgreSQL holds."""
import pytest
from sqlalchemy import text

from webapp.db import db, lab_session


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
