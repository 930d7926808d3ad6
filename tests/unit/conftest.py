"""Fixtures the validator's unit tests share: the default catalogue and a tokenizer cache (each made once a module)."""

import pytest

from contracts.catalogue import Catalogue
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.tokenizer import TokenizerCache


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue(None)


@pytest.fixture(scope="module")
def tokenizers() -> TokenizerCache:
    return TokenizerCache()
