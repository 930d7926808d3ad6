"""Every code has one description, shown alike in the dashboard's help and the docs: docs/error-codes.md is what
the codes' source says, and every code the validator can write has a title and a fix there."""

import re
from pathlib import Path

from contracts.api.error_codes import ERROR_CODE_HELP
from infra.error_code_reference import reference_markdown

ROOT = Path(__file__).parents[3]


def test_docs_error_codes_md_is_what_the_source_says() -> None:
    assert (ROOT / "docs" / "error-codes.md").read_text() == reference_markdown(), \
        "docs/error-codes.md is stale: python -m infra.error_code_reference > docs/error-codes.md"


def test_every_code_the_validator_writes_has_help() -> None:
    written = {code for path in (ROOT / "services" / "validator").rglob("*.py")
               for code in re.findall(r'LineIssue\(\s*"([a-z_]+)"', path.read_text())}
    assert written, "the validator's codes are found in its source"
    assert sorted(written - set(ERROR_CODE_HELP)) == []
