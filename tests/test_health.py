"""/healthz tells the truth about PostgreSQL and Kafka."""
import subprocess
import sys

from support import ROOT, service_env, stop_process, wait_for_agent
from webapp.dev.embedded import EmbeddedBroker
from webapp.domain.waits import wait_until


def test_healthy_lab(client, agent):
    response = client.get("/healthz")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["kafka"] == {"ok": True}


def test_broker_stopped_is_reported_with_the_reason(services, app_factory, tmp_path):
    """A broker of this test's own, watched by an agent of its own; then the broker stops."""
    broker = EmbeddedBroker(tmp_path / "tansu.log").start()
    env = service_env(services, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers)
    log = open(tmp_path / "agent.log", "ab")
    agent = subprocess.Popen([sys.executable, "-m", "webapp.agent"], env=env, cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT)
    try:
        wait_for_agent(services.database_url, agent, tmp_path / "agent.log")
        client = app_factory().test_client()
        # The session's agent reports too (its broker is up): an agent that cannot reach Kafka wins.
        wait_until(lambda: client.get("/healthz").status_code == 200, timeout=15,
                   message="healthz never became healthy")
        broker.stop()
        response = wait_until(lambda: (r := client.get("/healthz")).status_code == 503 and r, timeout=20,
                              message="healthz kept answering 200 after the broker stopped")
        body = response.get_json()
        assert body["postgres"]["ok"] is True
        assert body["kafka"]["ok"] is False
        assert "Kafka" in body["kafka"]["error"]
    finally:
        stop_process(agent)
        broker.stop()
        log.close()


def test_database_down_is_reported(app_factory):
    app = app_factory(DATABASE_URL="postgresql://postgres@127.0.0.1:9/none")
    response = app.test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["postgres"]["ok"] is False and body["postgres"]["error"]
    assert "unknown" in body["kafka"]["error"]
