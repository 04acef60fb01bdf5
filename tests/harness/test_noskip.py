"""A skip in this suite fails the run (tests/noskip.py): pytest runs over small test files with the hooks
loaded as `-p noskip`, in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from noskip import NO_SKIPS

HERE = Path(__file__).resolve().parents[1]


def run_pytest(directory: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "noskip", "-p", "no:cacheprovider", "-rA",
                           "--rootdir", str(directory), *files],
                          cwd=directory, env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_skipped_tests_fail_with_their_reason_and_xfail_stays_as_it_is(tmp_path):
    (tmp_path / "test_inner.py").write_text(
        "import pytest\n"
        "def test_passes():\n    pass\n"
        "def test_skips_itself():\n    pytest.skip('no loader here')\n"
        "@pytest.mark.skip(reason='marked')\ndef test_marked_skip():\n    pass\n"
        "@pytest.mark.skipif(True, reason='never here')\ndef test_skipif():\n    pass\n"
        "@pytest.mark.xfail(reason='known')\ndef test_expected_failure():\n    assert False\n")
    result = run_pytest(tmp_path, "test_inner.py")
    # A skip in the test fails it; one at setup (a skip mark, or a fixture that skips) errs.
    assert "1 failed, 1 passed, 1 xfailed, 2 errors" in result.stdout.strip().splitlines()[-1], result.stdout
    assert f"{NO_SKIPS}: no loader here" in result.stdout
    assert f"{NO_SKIPS}: marked" in result.stdout
    assert f"{NO_SKIPS}: never here" in result.stdout
    assert result.returncode == 1


def test_a_module_that_skips_itself_fails_the_collection(tmp_path):
    (tmp_path / "test_module_skip.py").write_text(
        "import pytest\npytest.skip('no journal-remote', allow_module_level=True)\n"
        "def test_never_collected():\n    pass\n")
    result = run_pytest(tmp_path, "test_module_skip.py")
    assert f"{NO_SKIPS}: no journal-remote" in result.stdout, result.stdout
    assert "1 error" in result.stdout.strip().splitlines()[-1], result.stdout
    assert result.returncode != 0
