"""The optional settings file: a table per service, below the environment and above the defaults; a typo, a
secret, a missing or broken file is refused with a message that says where."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.up import use_config_file
from services.executor.settings import ExecutorSettings
from services.gateway.settings import GatewaySettings
from services.ledger.settings import LedgerSettings
from services.runtime.process.config_file import CONFIG_FILE_VARIABLE, ConfigFileError, section_of
from services.runtime.process.settings import ConnectionSettings


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "sheshnag.toml"
    monkeypatch.setenv(CONFIG_FILE_VARIABLE, str(path))
    return path


def test_each_service_reads_its_own_table_and_every_one_the_connection_table(config: Path) -> None:
    config.write_text('[connection]\ns3_bucket = "batches"\n[gateway]\nmax_active_batches = 500\nport = 9090\n'
                      '[executor]\nline_attempts = 8\n')
    gateway = GatewaySettings()
    assert (gateway.max_active_batches, gateway.port, gateway.connection.s3_bucket) == (500, 9090, "batches")
    executor = ExecutorSettings()
    assert executor.line_attempts == 8 and executor.connection.s3_bucket == "batches"
    assert LedgerSettings().connection.s3_bucket == "batches"


def test_the_environment_wins_over_the_file_and_the_file_over_the_default(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config.write_text("[gateway]\nmax_active_batches = 500\nupload_slots = 4\n")
    monkeypatch.setenv("SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES", "7")
    gateway = GatewaySettings()
    assert (gateway.max_active_batches, gateway.upload_slots, gateway.download_slots) == (7, 4, 64)


def test_a_setting_no_service_has_is_refused_naming_it(config: Path) -> None:
    config.write_text("[gateway]\nmax_active_batchs = 500\n")
    with pytest.raises(ConfigFileError, match=r"\[gateway\] .* no setting max_active_batchs"):
        GatewaySettings()


def test_a_secret_in_the_file_is_refused(config: Path) -> None:
    config.write_text('[connection]\ns3_secret_key = "hunter2"\n')
    with pytest.raises(ConfigFileError, match="credentials stay in the environment"):
        ConnectionSettings()
    config.write_text('[ledger]\npostgres_password = "hunter2"\n')
    with pytest.raises(ConfigFileError, match="postgres_password"):
        LedgerSettings()


def test_a_missing_or_broken_file_is_refused(config: Path) -> None:
    with pytest.raises(ConfigFileError, match="does not exist"):
        GatewaySettings()
    config.write_text("[gateway\n")
    with pytest.raises(ConfigFileError, match="not TOML"):
        GatewaySettings()


def test_a_wrong_value_fails_as_the_environment_would(config: Path) -> None:
    config.write_text('[gateway]\nmax_active_batches = "many"\n')
    with pytest.raises(ValidationError):
        GatewaySettings()


def test_up_refuses_a_bad_file_before_starting_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "up.toml"
    path.write_text("[executor]\nthreads = 8\n")
    monkeypatch.setenv(CONFIG_FILE_VARIABLE, "")  # use_config_file sets it for the processes up starts: undone after
    with pytest.raises(SystemExit, match="no setting threads"):
        use_config_file(path)


def test_tables_are_named_after_the_variables_prefix() -> None:
    assert [section_of(cls) for cls in (ConnectionSettings, GatewaySettings, ExecutorSettings)] == [
        "connection", "gateway", "executor"]
