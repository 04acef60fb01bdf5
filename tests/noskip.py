"""A skipped test fails: this suite runs every real component it uses (tests/run installs them all),
so a skip would only hide a broken install step or a missing privilege. conftest.py takes these hooks;
`pytest -p noskip` loads them anywhere else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

NO_SKIPS = "skipped, but this suite skips nothing (tests/run installs every component; run it as root)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    _fail_if_skipped(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_if_skipped(outcome.get_result())


def _fail_if_skipped(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")  # how a collection-time skip words its reason
        report.outcome = "failed"
        report.longrepr = f"{NO_SKIPS}: {reason}"
