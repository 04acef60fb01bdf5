"""Fixtures shared across test modules. Helpers live in plain modules beside this file
(fakeze, fakesysfs, journalgen, exporterproc) so scripts can use them too."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakeze import build_fake_driver


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden /metrics files from this run instead of comparing")


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test-only Level Zero driver, compiled once per run, loaded by the real Debian loader."""
    return build_fake_driver(tmp_path_factory.mktemp("fakeze"))


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return tmp_path / "fake_ze.conf"


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))
