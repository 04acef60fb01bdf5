"""The exporter's log lines (exporter/logformat.py): a logged exception keeps its traceback when logging at
debug level, as one escaped field, and only there."""

from __future__ import annotations

import io
import logging

import pytest

from vllm_xpu_exporter.logformat import setup_logging

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


def failing_function() -> None:
    raise ValueError("the config is broken")


def logged(level: str, fmt: str, log_at: int) -> str:
    stream = io.StringIO()
    setup_logging(level, fmt)
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        failing_function()
    except ValueError:
        logging.getLogger("vllm_xpu_exporter.test").log(log_at, "it failed", exc_info=True)
    return stream.getvalue()


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_at_debug_level_an_exception_keeps_its_traceback_in_one_line(fmt: str):
    line = logged("debug", fmt, logging.DEBUG)
    assert line.count("\n") == 1, line
    assert "err" in line and "ValueError: the config is broken" in line
    assert "stack" in line and "failing_function" in line and "test_logformat.py" in line


def test_above_debug_level_an_exception_is_one_err_field_without_its_traceback():
    line = logged("info", "logfmt", logging.WARNING)
    assert 'err="ValueError: the config is broken"' in line
    assert "stack=" not in line and "failing_function" not in line
