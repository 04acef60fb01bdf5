"""benchmarks/scrape_bench.py's baseline: the exporter of another revision, exported so that it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from scrape_bench import baseline_package, export_exporter  # noqa: E402


def test_a_baselines_files_linked_from_outside_the_package_are_written_as_that_revisions_files(tmp_path):
    """The runbook the exporter serves is a symlink to docs/runbook.md: exported alone, the package held a
    dangling link and the baseline exporter failed at start."""
    export_exporter("HEAD", tmp_path)
    package = tmp_path / baseline_package(tmp_path)
    runbook = package / "http" / "runbook.md"
    assert not runbook.is_symlink()
    shipped = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:docs/runbook.md"], capture_output=True,
                             check=True).stdout
    assert runbook.read_bytes() == shipped
    assert not [path for path in package.rglob("*") if path.is_symlink()]
