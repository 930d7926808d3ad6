"""The settings reference is generated from the settings classes and kept current: docs/settings.md is exactly what
the classes say, every variable says what it does, and each service's `--help` lists its own."""

from pathlib import Path

import pytest

from infra.cli import parse_args
from infra.settings_reference import SERVICE_SETTINGS, reference_markdown, settings_of
from services.runtime.process.settings import ConnectionSettings

DOC = Path(__file__).parents[3] / "docs" / "settings.md"


def test_docs_settings_md_is_what_the_settings_classes_say() -> None:
    assert DOC.read_text() == reference_markdown(), \
        "docs/settings.md is stale: python -m infra.settings_reference > docs/settings.md"


@pytest.mark.parametrize("cls", [ConnectionSettings, *SERVICE_SETTINGS.values()], ids=lambda c: c.__name__)
def test_every_variable_says_what_it_does(cls: type) -> None:
    undocumented = [s.variable for s in settings_of(cls) if not s.doc]
    assert undocumented == []


def test_a_services_help_lists_its_settings_and_the_connections(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["gateway", "--help"])
    shown = capsys.readouterr().out
    assert "SHESHNAG_GATEWAY_BILLING (default False)" in shown and "SHESHNAG_NATS_URL" in shown
    assert "SHESHNAG_VALIDATOR_" not in shown
