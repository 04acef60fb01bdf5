"""The recipe for a container runtime (docs/development/architecture.md, "Adding a container runtime"), followed
once: a runtime that exists only in the tests, Crate (tests/fixtures/runtime-recipe/: its facts, `crate.py`, and
its state, `crate_state.py`), is added to a copy of the package as those two modules and one row of
`runtimes/registry.py`, and no other file. The copy then names Crate's containers from their cgroup paths (systemd
scope and cgroupfs), reads their names from Crate's state, and reads their log files, rotated ones first, and
their end, through the generic sources (parsers/cgroup.py, sources/containers.py, sources/containerlogs.py),
which never heard of Crate. The same copy without the row names nothing: the row is what does it."""

from __future__ import annotations

import difflib
import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "runtime-recipe"
CID = "c" * 64
ROW = "    Runtime(crate, crate_state),\n"
IMPORT = "from vllm_xpu_exporter.runtimes import crate, crate_state\n"

PROBE = r'''
import json, sys
import vllm_xpu_exporter
from vllm_xpu_exporter.parsers.cgroup import unit_cgroup_of_path
from vllm_xpu_exporter.sources.containers import ContainerNames
from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
from vllm_xpu_exporter.sources.logs.entry import LogSelection

root, cid = sys.argv[1], sys.argv[2]
out = {"package": vllm_xpu_exporter.__file__}
try:
    names = ContainerNames(crate_roots=(root,))
except TypeError as error:
    out["names"], names = str(error), ContainerNames()
for shape, path in (("scope", f"/system.slice/crate-{cid}.scope"), ("cgroupfs", f"/crate/{cid}/payload")):
    unit = unit_cgroup_of_path(path)
    workload = names.workload(unit.unit, unit.container)
    out[shape] = [workload.unit, workload.kind, workload.container_id, workload.container,
                  names.key_of_cgroup_path(path)]
try:
    directories = LogDirectories(crate_roots=(root,))
except TypeError as error:
    out["logs"] = str(error)
else:
    with ContainerLogReader(LogSelection(container_globs=("*vllm*",), boot="all"), directories) as reader:
        out["logs"] = [[entry.unit, entry.realtime_usec, entry.message, entry.container_run, entry.from_systemd,
                        entry.message_id] for entry in reader.read_available(100)]
print(json.dumps(out))
'''


def materialise(tmp_path: Path, *, with_row: bool) -> Path:
    """A copy of the package as vllm_xpu_exporter under tmp_path, with Crate's two modules (and its registry row)."""
    package = tmp_path / "vllm_xpu_exporter"
    shutil.copytree(REPO / "exporter", package, ignore=shutil.ignore_patterns("__pycache__"))
    runtimes = package / "runtimes"
    for module in ("crate.py", "crate_state.py"):
        shutil.copy(RECIPE / module, runtimes / module)
    if with_row:
        registry = runtimes / "registry.py"
        text = registry.read_text()
        last_import = ("from vllm_xpu_exporter.runtimes import docker, docker_state, podman, podman_state, pods, "
                       "pods_state\n")
        last_row = "    Runtime(podman, podman_state),\n"
        assert text.count(last_import) == 1 and text.count(last_row) == 1, "the registry is not as the recipe says"
        registry.write_text(text.replace(last_import, last_import + IMPORT).replace(last_row, last_row + ROW))
    return package


def changed_files(package: Path) -> tuple[list[str], list[str]]:
    """(files added, files changed) in the copy against exporter/."""
    added, changed = [], []

    def walk(comparison: filecmp.dircmp, prefix: str) -> None:
        added.extend(f"{prefix}{name}" for name in comparison.right_only)
        changed.extend(f"{prefix}{name}" for name in comparison.diff_files)
        assert not comparison.left_only, comparison.left_only
        for name, sub in comparison.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(filecmp.dircmp(REPO / "exporter", package, ignore=["__pycache__"]), "")
    return sorted(added), sorted(changed)


def probe(tmp_path: Path, package: Path) -> dict:
    root = tmp_path / "crate"
    state = root / CID
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"name": "vllm-chat", "ended": "2026-01-02T03:04:09Z",
                                                  "stopped": False}))
    (state / "output.log.1").write_text("2026-01-02T03:04:05Z stdout first\n")
    (state / "output.log").write_text("2026-01-02T03:04:06Z stderr second\nnot a record\n")
    # -S: no site-packages, so not the installed package either: only the copy
    completed = subprocess.run([sys.executable, "-S", "-c", PROBE, str(root), CID], cwd=tmp_path, text=True,
                               capture_output=True, timeout=60, env={"PYTHONPATH": str(package.parent)})
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    assert found.pop("package") == str(package / "__init__.py")
    return found


def test_a_runtime_added_as_two_modules_and_a_registry_row_names_its_containers_and_reads_their_logs(tmp_path):
    package = materialise(tmp_path, with_row=True)
    assert changed_files(package) == (["runtimes/crate.py", "runtimes/crate_state.py"], ["runtimes/registry.py"])
    diff = [line for line in difflib.unified_diff((REPO / "exporter/runtimes/registry.py").read_text().splitlines(True),
                                                  (package / "runtimes/registry.py").read_text().splitlines(True), n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == ["+" + IMPORT, "+" + ROW]

    found = probe(tmp_path, package)
    assert "names" not in found
    assert found["scope"] == found["cgroupfs"] == ["crate/vllm-chat", "crate", CID, "vllm-chat", "crate/vllm-chat"]
    first, second, end = 1767323045_000000, 1767323046_000000, 1767323049_000000
    assert found["logs"] == [
        ["crate/vllm-chat", first, "first", CID, False, ""],
        ["crate/vllm-chat", second, "second", CID, False, ""],
        ["crate/vllm-chat", end, "", CID, True, "98e322203f7a4ed290d09fe03c09fe15"],  # systemd's "process exited"
    ]


def test_without_its_registry_row_the_runtime_names_nothing(tmp_path):
    """The control: the same two modules without the row; the cgroup keeps its leaf, Crate's directories are
    nobody's."""
    package = materialise(tmp_path, with_row=False)
    assert changed_files(package) == (["runtimes/crate.py", "runtimes/crate_state.py"], [])
    found = probe(tmp_path, package)
    assert found == {
        "names": "no container runtime's state is at crate_roots",
        "scope": [f"crate-{CID}.scope", "systemd", "", "", f"crate-{CID}.scope"],
        "cgroupfs": ["payload", "systemd", "", "", "payload"],
        "logs": "no container runtime keeps its logs at crate_roots",
    }
