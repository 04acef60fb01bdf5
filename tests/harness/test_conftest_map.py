"""tests/conftest.py's docstring names every helper module beside it, so a newcomer finds each once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conftest

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parents[1]


def test_every_helper_module_is_in_the_conftest_map() -> None:
    helpers = {path.stem for path in TESTS.glob("*.py") if not path.stem.startswith("test_")} - {"conftest"}
    named = set(re.findall(r"\b([a-z]+)\b", conftest.__doc__ or ""))
    assert sorted(helpers - named) == [], "helpers missing from tests/conftest.py's docstring map"
