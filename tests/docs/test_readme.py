"""The README and the user docs are kept true: the metric reference (docs/metrics.md) names exactly what the
exporter serves when every collector has something to say; the README is short (at most 200 lines), shows
/metrics and a Prometheus job on its first screen, and its quick start's two commands work (CI runs the test
command, no other); every link of the README and the docs resolves; no user doc speaks of the tracker's
issues; the README, `--help` and the landing page name units, containers and pods."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from exporterproc import REPO, RunningExporter
from fakeprocfs import FakeProcfs, i915_fdinfo, xe_fdinfo
from fakeze import A770_TELEMETRY, FakeConfig, fake_driver_env, write_config
from httpclient import request
from journalgen import JournalEntrySpec, random_boot_id, write_journal
from polling import wait_for
from scrapes import parse_samples, sample
from sizes import GiB
from vllm_xpu_exporter.planner import cli as plan
from vllm_xpu_exporter.http.runbook import heading_anchor
from vllmlogs import Boot, VllmRun, chat_runs, compose, journal_specs, service_start

CHAT, EMBEDDING, STT = "vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service"
ORIGIN = 1_747_130_000.0


def every_kind_of_start() -> list[JournalEntrySpec]:
    """A failed then a successful start of chat (a new main pid, as after a real restart), and a start of
    embedding with kv_cache_memory_bytes set, overlapping chat's second init, and a start of stt whose vLLM
    startup plan fell back and that went to sleep after its requests."""
    failed, started = chat_runs()
    first = service_start(CHAT, failed, ORIGIN, restart_counter=1)
    restart = service_start(CHAT, started, first.restart_at, job_id=110)
    embedding = service_start(EMBEDDING, VllmRun("0.24.0", model="BAAI/bge-m3", kv_cache_memory_bytes=GiB),
                              first.restart_at + 1.0, job_id=200)
    stt = service_start(STT, VllmRun("0.34.0", model="openai/whisper-large-v3", startup_plan="fallback",
                                     startup_plan_baseline_gib=15.9, sleep_freed_gib=3.1),
                        first.restart_at + 300.0, job_id=300)
    entries = first.entries + restart.entries + embedding.entries + stt.entries
    return journal_specs(compose(Boot(random_boot_id(), ORIGIN - 20.0, entries)))


def test_the_metric_reference_documents_exactly_the_metrics_the_exporter_serves(tmp_path, fake_driver, config_path):
    documented = set(re.findall(r"^\| `((?:xpu|process|python)_[a-z_]+)` \|", (REPO / "docs/metrics.md").read_text(), re.M))
    write_config(config_path, FakeConfig(devices=(A770_TELEMETRY,), usable_memory_extension=True))
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=2 * GiB))
    # an i915 client (of an integrated GPU), whose engine counters are busy time, not xe's cycles
    procfs.add_unit_process(200, f"/system.slice/{EMBEDDING}").add_drm_fd(i915_fdinfo(client_id=2, pdev="0000:00:02.0"))
    journal = write_journal(tmp_path / "units.journal", every_kind_of_start())
    plans = tmp_path / "system"  # the planner's drop-in for chat (xpu_unit_kv_cache_plan_bytes)
    (plans / f"{CHAT}.d").mkdir(parents=True)
    (plans / f"{CHAT}.d" / plan.DROP_IN_NAME).write_text(f"[Service]\nLogExtraFields={plan.PLAN_FIELD}=3481927680\n")
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all",
                          "--collector.processes.plans", str(plans)],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and s)
    served = {name for name, _ in samples}
    assert documented == served


def quick_start_commands() -> dict[str, str]:
    """The README quick start's commands, by the sentence that introduces each ("Run the exporter",
    "Run the tests")."""
    quick_start = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = {}
    for intro, command in re.findall(r"^(Run the \w+)[^\n]*\n(?:[^\n]+\n)*?\n    (\S[^\n]*)\n", quick_start, re.M):
        commands[intro] = command
    return commands


def test_ci_runs_exactly_the_readme_test_command():
    commands = quick_start_commands()
    assert commands.keys() == {"Run the exporter", "Run the tests"}
    ci_commands = [line for line in (REPO / ".ci/run").read_text().splitlines()
                   if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci_commands == [f"exec {commands['Run the tests']}"]


def test_the_readme_run_command_serves_metrics_from_a_fresh_copy_without_gpu_or_vllm(tmp_path):
    """The newcomer's first command, as written, in a copy of the tree without .venv: it installs the
    project, starts the exporter on the default port and serves, saying Level Zero failed (this machine
    has the loader but no GPU driver) and the journal collector worked (no vLLM unit is watched)."""
    tree = tmp_path / "tree"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    command = quick_start_commands()["Run the exporter"]
    run = subprocess.Popen(["bash", "-c", command], cwd=tree, start_new_session=True,
                           env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        served = wait_for(lambda: _scrape_default_port(), timeout=240, interval=0.5)
        assert served, f"nothing served on :{DEFAULT_PORT}: {_stop(run)}"
        headers, body = served
        assert headers["Server"].startswith("vllm-xpu-exporter/")
        samples = parse_samples(body.decode())
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 0
        assert sample(samples, "xpu_exporter_collector_success", collector="journal") == 1
    finally:
        _stop(run)


DEFAULT_PORT = 10447


def _scrape_default_port() -> tuple[Any, bytes] | None:
    try:
        status, headers, body = request("127.0.0.1", DEFAULT_PORT, timeout=5)
    except OSError:
        return None
    return (headers, body) if status == 200 else None


def _stop(run: subprocess.Popen[bytes]) -> str:
    """Stops the command's processes (pip's or the exporter); the end of what they printed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGTERM)
    output, _ = run.communicate(timeout=30)
    return output.decode(errors="replace")[-3000:]


README_MAX_LINES = 200
FIRST_SCREEN_LINES = 40


def test_the_readme_is_at_most_200_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_the_first_screen_reaches_metrics_and_a_prometheus_job():
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:FIRST_SCREEN_LINES])
    assert "pip install ." in first_screen and "http://localhost:10447/metrics" in first_screen
    assert "job_name: vllm-xpu-exporter" in first_screen and "rules/vllm-xpu-exporter.yaml" in first_screen
    assert "grafana/vllm-xpu-exporter.json" in first_screen


def user_docs() -> list[Path]:
    """What a user reads: the README, SECURITY.md, the changelog and docs/ (docs/development/ is for
    contributors)."""
    docs = sorted(path for path in (REPO / "docs").glob("*.md"))
    return [REPO / "README.md", REPO / "SECURITY.md", REPO / "CHANGELOG.md", *docs]


def markdown_files() -> list[Path]:
    return [*user_docs(), *sorted((REPO / "docs" / "development").glob("*.md"))]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation but - and _ dropped, spaces -."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S), re.M)
    return {heading_anchor(heading) for heading in headings}


def test_every_relative_link_of_the_readme_and_the_docs_resolves_to_a_file_and_its_heading():
    broken = []
    for document in markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists():
                broken.append(f"{document.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{document.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_no_user_doc_speaks_of_the_trackers_issues():
    """A reader has no tracker: "Issue 12", "before issue 19" or "the issue's host" say nothing to them."""
    mentions = [f"{path.relative_to(REPO)}: {match.group(0)}" for path in user_docs()
                for match in re.finditer(r"\b[Ii]ssues? \d+|\b[Ii]ssues? #\d+|\bthe issue's", path.read_text())]
    assert not mentions, mentions


# Where the project's authors kept their notes: a reader of the project has none of it. Written in two parts
# so that this file does not name them itself.
OUTSIDE_CITATIONS = re.compile("/" + "work/|" + r"\.\./" + "shared|shared/" + "reference|CONTRACT" + r"\.md")


def test_the_project_cites_nothing_outside_itself():
    """No file of the repository points at a machine path or at notes outside it: what they taught is written
    in the project's own words."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    citing = []
    for name in filter(None, tracked.decode().split("\0")):
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            text = path.read_bytes().decode("utf-8", "replace")
            citing += [f"{name}: {match.group(0)}" for match in OUTSIDE_CITATIONS.finditer(text)]
    assert not citing, citing


def names_units_containers_and_pods(text: str) -> bool:
    return all(word in text for word in ("systemd units", "containers", "pods"))


def test_the_readme_help_and_landing_page_name_units_containers_and_pods(tmp_path):
    assert names_units_containers_and_pods(" ".join((REPO / "README.md").read_text().split("\n## ", 1)[0].split()))
    help_text = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter", "--help"], capture_output=True,
                               text=True, check=True, timeout=60).stdout
    assert names_units_containers_and_pods(" ".join(help_text.split()))
    with RunningExporter() as exporter:
        status, _, body = exporter.get("/")
    assert status == 200 and names_units_containers_and_pods(" ".join(body.decode().split()))
