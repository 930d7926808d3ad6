"""The ledger application every unit test of the ledger folds into: in memory, closed after the test."""

from collections.abc import Iterator

import pytest

from services.ledger.application import Ledger, persistence_env


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    app = Ledger(persistence_env(None))
    yield app
    app.close()
