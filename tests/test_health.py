"""/healthz tells the truth about PostgreSQL and Kafka. (A broker killed under its agent:
tests/test_service_health.py, which checks /healthz with the status bar.)"""


def test_healthy_lab(client, agent):
    response = client.get("/healthz")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["kafka"] == {"ok": True}


def test_database_down_is_reported(app_factory):
    app = app_factory(DATABASE_URL="postgresql://postgres@127.0.0.1:9/none")
    response = app.test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["postgres"]["ok"] is False and body["postgres"]["error"]
    assert "unknown" in body["kafka"]["error"]
