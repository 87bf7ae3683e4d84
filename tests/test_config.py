"""Settings: defaults, environment, test dict; the loopback rule; the kept SECRET_KEY."""
import pytest

from webapp.settings import ConfigError, is_loopback, load_config


def config(tmp_path, environ=None, **overrides):
    return load_config(environ={"LAB_DATA_DIR": str(tmp_path), **(environ or {})}, overrides=overrides,
                       env_file=None)


def test_defaults(tmp_path):
    c = config(tmp_path)
    assert c["LAB_HOST"] == "127.0.0.1"
    assert c["LAB_PORT"] == 5000
    assert c["LAB_PARTITIONS"] == 3
    assert c["DATABASE_URL"] is None


def test_environment_then_overrides(tmp_path):
    c = config(tmp_path, {"LAB_PORT": "5050", "DATABASE_URL": "postgresql://env/db"}, LAB_PORT=6000)
    assert c["LAB_PORT"] == 6000
    assert c["DATABASE_URL"] == "postgresql://env/db"


def test_env_file_is_read(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("LAB_PARTITIONS=4\n")
    c = load_config(environ={"LAB_DATA_DIR": str(tmp_path)}, env_file=env_file)
    assert c["LAB_PARTITIONS"] == 4


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "lab.example"])
def test_non_loopback_bind_needs_a_token(tmp_path, host):
    with pytest.raises(ConfigError, match="LAB_TOKEN"):
        config(tmp_path, {"LAB_HOST": host})
    assert config(tmp_path, {"LAB_HOST": host, "LAB_TOKEN": "s3cret"})["LAB_HOST"] == host


@pytest.mark.parametrize("host,expected", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False), ("10.0.0.1", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_lab_https_is_off_unless_set_to_1(tmp_path):
    assert config(tmp_path)["LAB_HTTPS"] == 0
    assert config(tmp_path, {"LAB_HTTPS": "1"})["LAB_HTTPS"] == 1


@pytest.mark.parametrize("key,value", [("LAB_PORT", "eighty"), ("LAB_PARTITIONS", "0"), ("LAB_PARTITIONS", "99"),
                                       ("LAB_HTTPS", "yes")])
def test_bad_numbers_are_refused_clearly(tmp_path, key, value):
    with pytest.raises(ConfigError, match=key):
        config(tmp_path, {key: value})


def test_secret_key_is_generated_once_and_kept(tmp_path):
    first = config(tmp_path)["SECRET_KEY"]
    assert len(first) == 64
    assert config(tmp_path)["SECRET_KEY"] == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_running_lab_supplies_service_addresses(tmp_path):
    (tmp_path / "running.json").write_text('{"DATABASE_URL": "postgresql://run/db", "KAFKA_BOOTSTRAP_SERVERS": "x:1"}')
    c = config(tmp_path)
    assert c["DATABASE_URL"] == "postgresql://run/db"
    assert c["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] == "x:1"
