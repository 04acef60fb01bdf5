"""vllm-xpu-plan over journal files written by systemd-journal-remote (tests/journalgen.py) holding the seed
host's three units as vLLM 0.24 prints them (tests/vllmlogs.py's boot race figures) and a unit on a release
without --kv-cache-memory-bytes on XPU; offline (--device-memory) on a 16 GiB GPU. The fold's memory fields
per release, and the drop-in's command editing, in process; and the exporter's planned figures against the
planner's, to the byte."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.planner import cli as plan, plans
from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.sources import plan_dropins
from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import current_boot_id, write_journal
from mountns import tmpfs_in_own_mount_namespace
from polling import wait_for
from scrapes import sample, series
from sizes import GiB
from vllmlogs import (CHAT, EMBEDDING, STT, Boot, Failure, VllmRun, compose, journal_specs, race_chat_runs,
                      race_embedding_run, race_stt_run, service_runs, tracker_entries)

SIXTEEN_GIB = 17179869184
LEGACY = "vllm-xpu-legacy.service"


def seed_runs() -> dict[str, VllmRun]:
    _, chat = race_chat_runs()
    legacy = VllmRun("0.15.1", model="Qwen/Qwen3-1.7B", gpu_memory_utilization=0.02, max_model_len=4096,
                     max_num_seqs=4, main_pid=2310)
    return {CHAT: chat, EMBEDDING: race_embedding_run(), STT: race_stt_run(), LEGACY: legacy}


def seed_placed(runs: dict[str, VllmRun] | None = None) -> list:
    runs = runs or seed_runs()
    boot_at = 1_747_044_600.0
    planned = []
    for index, (unit, run) in enumerate(runs.items()):
        planned += service_runs(unit, [run], boot_at + 60 + index * 0.001, job_id=120 + index)
    return compose(Boot(current_boot_id(), boot_at, tuple(planned)))


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "system.journal"
    write_journal(path, journal_specs(seed_placed()))
    return path


def run_plan(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(journal),
                           "--device-memory", str(SIXTEEN_GIB), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_journal_file_given_by_a_bare_name_is_read_by_the_planner_and_the_exporter(journal: Path) -> None:
    """sd-journal opens absolute paths only ("Destination address required" otherwise): a name relative to the
    working directory is made absolute when the flag is parsed."""
    planned = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", journal.name,
                              "--device-memory", str(SIXTEEN_GIB), "--format", "json"],
                             capture_output=True, text=True, timeout=120, check=False, cwd=journal.parent)
    assert planned.returncode == 3, planned.stderr  # the plan of the seed journal: one unit left out
    assert json.loads(planned.stdout)["devices"]
    with RunningExporter(["--journal.file", journal.name, "--journal.boot", "all", "--no-collector.levelzero",
                          "--no-collector.processes"], cwd=journal.parent) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        stderr = exporter.stderr
    assert samples, stderr  # the journal collector works: the file was opened
    assert sample(samples, "xpu_exporter_journal_units_watched") == len(seed_runs())


# --- the fold gives the planner the non-KV memory -----------------------------------------------------

def unit_views(runs: dict[str, VllmRun]) -> list:
    tracker = EngineTracker()
    tracker.extend(tracker_entries(seed_placed(runs)))
    return tracker.views()


def latest_starts(runs: dict[str, VllmRun]) -> dict[str, object]:
    return {view.unit: view.latest for view in unit_views(runs)}


@pytest.mark.fast
def test_the_fold_keeps_the_weights_of_0_24_and_no_split() -> None:
    start = latest_starts({CHAT: race_chat_runs()[1]})[CHAT]
    assert start.weights_bytes == round(8.58 * GiB)
    assert (start.activation_bytes, start.non_torch_bytes, start.consumed_bytes) == (None, None, None)


@pytest.mark.fast
@pytest.mark.parametrize(("version", "split"), [
    ("0.26.0", {"weights_bytes": round(8.58 * GiB), "activation_bytes": round(0.51 * GiB),
                "non_torch_bytes": round(0.12 * GiB), "consumed_bytes": None}),
    ("0.28.0", {"weights_bytes": round(8.58 * GiB), "activation_bytes": round(0.51 * GiB),
                "non_torch_bytes": None, "consumed_bytes": round(8.70 * GiB)}),
])
def test_the_fold_keeps_the_start_up_summary(version: str, split: dict[str, int | None]) -> None:
    start = latest_starts({CHAT: replace(race_chat_runs()[1], version=version)})[CHAT]
    assert {name: getattr(start, name) for name in split} == split


@pytest.mark.fast
def test_the_fold_keeps_the_profiling_split_of_0_15() -> None:
    start = latest_starts({LEGACY: seed_runs()[LEGACY]})[LEGACY]
    assert start.weights_bytes is not None and start.non_torch_bytes == 128 << 20


# --- the plan ------------------------------------------------------------------------------------------

def test_the_seed_host_fits_with_one_full_length_chat_request(journal: Path) -> None:
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "json")
    assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr  # the unit on 0.15.1 is left out
    document = json.loads(result.stdout)
    assert document["schema_version"] == plan.JSON_SCHEMA_VERSION
    [device] = document["devices"]
    assert device["fits"] and device["total_bytes"] == SIXTEEN_GIB and device["reserve_bytes"] == 512 << 20
    units = {u["unit"]: u for u in device["units"]}
    assert set(units) == {CHAT, EMBEDDING, STT}
    chat = units[CHAT]
    kv_bytes, kv_tokens = round(3.25 * GiB), 136_960
    assert chat["target_tokens"] == 131072
    # 2048 whole blocks of 64 and the null block, sized from the lowest concurrency "1.04x" can stand for
    at_the_print = (2048 + 1) * 64 * kv_bytes // kv_tokens
    assert at_the_print < chat["kv_cache_memory_bytes"] < at_the_print + 48 * (1 << 20)
    assert "from the concurrency vLLM printed" in chat["target"]
    # ceil(16 GiB x 0.75) - the least KV "3.25 GiB" can stand for
    assert chat["non_kv_bytes"] == 12 * GiB - memory_rules.printed_lower_bound(kv_bytes)
    assert chat["footprint_bytes"] == chat["non_kv_bytes"] + chat["kv_cache_memory_bytes"]
    assert chat["weights_bytes"] == round(8.58 * GiB)
    assert device["footprint_bytes"] == sum(u["footprint_bytes"] for u in units.values())
    legacy_held = math.ceil(SIXTEEN_GIB * 0.02)
    assert device["left_out_bytes"] == legacy_held
    assert device["left_bytes"] == SIXTEEN_GIB - (512 << 20) - device["footprint_bytes"] - legacy_held >= 0
    [legacy] = document["unplannable"]
    assert legacy["unit"] == LEGACY and "0.15.1" in legacy["why"] and "0.16.0" in legacy["remedy"]
    assert f"{LEGACY}: not plannable" in result.stderr


def test_the_default_target_is_the_kv_of_the_last_good_start_and_a_left_out_unit_exits_3(journal: Path) -> None:
    """The default is the KV each unit had when it last started (max_num_seqs 3 x 131072 tokens, ~9.3 GiB of
    KV, is printed as information only); the unit on 0.15.1 is left out, so the plan proves nothing: 3."""
    result = run_plan(journal, "--format", "json")
    assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr
    [device] = json.loads(result.stdout)["devices"]
    chat = next(u for u in device["units"] if u["unit"] == CHAT)
    assert chat["target_tokens"] == 136_960 - 64 and "last successful start" in chat["target"]
    assert any("max_num_seqs 3 x 131072 tokens would be 393216 tokens" in note for note in chat["notes"])
    assert abs(chat["kv_cache_memory_bytes"] - round(3.25 * GiB)) < 8 * (1 << 20)
    assert f"incomplete: 1 unit(s) left out of the plan ({LEGACY})" in result.stderr


def test_a_target_that_cannot_fit_exits_1_naming_chat_and_the_bytes_missing(journal: Path) -> None:
    result = run_plan(journal, "--requests", f"{CHAT}=40", "--format", "json")
    assert result.returncode == 1
    [device] = json.loads(result.stdout)["devices"]
    missing = device["missing_bytes"]
    assert missing == device["footprint_bytes"] + device["left_out_bytes"] + (512 << 20) - SIXTEEN_GIB > 0
    [line] = [line for line in result.stderr.splitlines() if "GPU offline does not fit" in line]
    assert f"GPU offline does not fit: {missing / GiB:.2f} GiB missing ({missing} bytes" in line
    [chat] = [line for line in result.stderr.splitlines() if f"  {CHAT}: " in line]
    assert "--requests 40 x 131072 tokens" in chat and f"largest that fits: --requests {CHAT}=" in chat
    largest = int(chat.split(f"largest that fits: --requests {CHAT}=")[1].split()[0])
    assert run_plan(journal, "--requests", f"{CHAT}={largest}").returncode == plan.EXIT_INCOMPLETE  # fits
    assert run_plan(journal, "--requests", f"{CHAT}={largest + 1}").returncode == plan.EXIT_DOES_NOT_FIT


def test_tokens_per_unit_and_the_table(journal: Path) -> None:
    result = run_plan(journal, "--tokens", "vllm-xpu-chat=140000", "--reserve", "1GiB")
    assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr
    assert "reserve 1073741824" in result.stdout and "--tokens 140000" in result.stdout
    assert "derived: requested - KV" in result.stdout


@pytest.mark.parametrize(("argv", "reason"), [
    (["--tokens", "vllm-xpu-chat=65"], "--tokens 65 is below one request of its maximum model length (131072"),
    (["--requests", "vllm-xpu-nope=1"], "vllm-xpu-nope.service: no vLLM start of it in the journal"),
])
def test_a_target_that_cannot_be_planned_is_a_one_line_usage_error(journal: Path, argv: list[str], reason: str) -> None:
    result = run_plan(journal, *argv)
    assert result.returncode == plan.EXIT_USAGE and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and reason in result.stderr, result.stderr


def fake_systemctl(tmp_path: Path, commands: dict[str, str], analyze: bool = True) -> Path:
    """A systemctl whose `cat` shows each unit's file with its ExecStart=, beside the real systemd-analyze
    (the planner runs the one beside its systemctl)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    vllm = bin_dir / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    cases = "".join(f"  {unit}) cat <<'EOF'\n# /etc/systemd/system/{unit}\n[Unit]\nDescription=vLLM\n[Service]\n"
                    f"ExecStart={command.format(vllm=vllm)}\nEOF\n  ;;\n" for unit, command in commands.items())
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!/bin/sh\ncase \"$3\" in\n{cases}  *) exit 1 ;;\nesac\n")
    systemctl.chmod(0o755)
    if analyze:
        (bin_dir / "systemd-analyze").symlink_to("/usr/bin/systemd-analyze")
    return systemctl


SEED_COMMANDS = {
    CHAT: "{vllm} serve google/gemma-3-4b-it \\\n#  --enforce-eager \\\n"
          "    --gpu-memory-utilization 0.75 --max-model-len 131072 --max-num-seqs 3",
    EMBEDDING: "{vllm} serve BAAI/bge-small-en-v1.5 --gpu-memory-utilization 0.07 --max-model-len 512",
    STT: "{vllm} serve openai/whisper-small --gpu-memory-utilization=0.07",
}


def test_systemd_drop_ins_restate_the_command_with_the_budget_and_pass_systemd_analyze(journal: Path,
                                                                                      tmp_path: Path) -> None:
    systemctl = fake_systemctl(tmp_path, SEED_COMMANDS)
    out = tmp_path / "drop-ins"
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", str(systemctl))
    assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr  # the unit on 0.15.1 is left out
    assert "not verified" not in result.stderr and "not applicable" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{unit}.d" for unit in (CHAT, EMBEDDING, STT))
    text = (out / f"{CHAT}.d" / plan.DROP_IN_NAME).read_text()
    exec_lines = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert exec_lines[0] == "ExecStart="
    command = exec_lines[1]
    assert command.startswith(f"ExecStart={tmp_path}/bin/vllm serve google/gemma-3-4b-it --max-model-len 131072")
    assert command.count("--gpu-memory-utilization") == 1 and "0.75" not in command and "eager" not in command
    assert "--kv-cache-memory-bytes " in command
    assert not [p for p in (out / f"{CHAT}.d").iterdir() if p.name != plan.DROP_IN_NAME]  # no temporary left
    # the budget again as the drop-in's LogExtraFields=, which systemd-analyze verify accepted with it and which
    # the exporter reads from the drop-in (xpu_unit_kv_cache_plan_bytes)
    budget = command.rsplit("--kv-cache-memory-bytes ", 1)[1]
    assert f"LogExtraFields={plan.PLAN_FIELD}={budget}" in text.splitlines()
    assert plan_dropins.parse_drop_in(text) == int(budget)


def test_units_beyond_the_journal_max_units_are_named_and_the_plan_exits_3(journal: Path) -> None:
    """--journal.max-units 2 of the seed's four units: the two not read are not planned, so the plan proves
    nothing (3), and its help says so (it names no metric of the exporter's)."""
    result = run_plan(journal, "--journal.max-units", "2", "--format", "json")
    assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr
    assert "2 unit(s) of the journal not read (beyond --journal.max-units 2)" in result.stderr
    help_text = " ".join(subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--help"], capture_output=True,
                                        text=True, check=True).stdout.split())
    assert "--journal.max-units N watch at most this many units; further ones are not read, so not planned" in help_text
    assert "xpu_exporter_" not in help_text


def test_a_unit_whose_command_a_drop_in_cannot_reach_stops_the_writing(journal: Path, tmp_path: Path) -> None:
    commands = {**SEED_COMMANDS, CHAT: "/bin/sh -c \"exec {vllm} serve m --gpu-memory-utilization 0.75\""}
    out = tmp_path / "drop-ins"
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", str(fake_systemctl(tmp_path, commands)))
    assert result.returncode == plan.EXIT_INCOMPLETE
    assert not out.exists()
    assert f"not applicable: {CHAT}: its ExecStart= runs vLLM through `sh -c" in result.stderr
    assert "nothing written" in result.stderr


def test_a_drop_in_systemd_analyze_refuses_is_not_written(journal: Path, tmp_path: Path) -> None:
    commands = {**SEED_COMMANDS, EMBEDDING: "/nonexistent/vllm serve m --gpu-memory-utilization 0.07"}
    out = tmp_path / "drop-ins"
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", str(fake_systemctl(tmp_path, commands)))
    assert result.returncode == plan.EXIT_INCOMPLETE and not out.exists()
    assert f"not applicable: {EMBEDDING}: systemd-analyze verify refuses it:" in result.stderr
    assert "/nonexistent/vllm is not executable" in result.stderr


def test_an_unreadable_command_writes_nothing(journal: Path, tmp_path: Path) -> None:
    out = tmp_path / "drop-ins"
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", str(fake_systemctl(tmp_path, {CHAT: SEED_COMMANDS[CHAT]}, analyze=False)))
    assert result.returncode == plan.EXIT_INCOMPLETE and not out.exists()
    assert f"not applicable: {EMBEDDING}: its one ExecStart= could not be read" in result.stderr
    assert "no systemd-analyze beside" in result.stderr


@pytest.mark.parametrize("planted", ["file", "directory"])
def test_the_drop_in_is_not_written_through_a_symlink(journal: Path, tmp_path: Path, planted: str) -> None:
    out = tmp_path / "drop-ins"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / plan.DROP_IN_NAME).write_text("precious\n")
    if planted == "file":
        (out / f"{CHAT}.d").mkdir(parents=True)
        (out / f"{CHAT}.d" / plan.DROP_IN_NAME).symlink_to(elsewhere / plan.DROP_IN_NAME)
    else:
        out.mkdir()
        (out / f"{CHAT}.d").symlink_to(elsewhere)
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", str(fake_systemctl(tmp_path, SEED_COMMANDS)))
    assert result.returncode == plan.EXIT_USAGE, result.stderr
    assert (elsewhere / plan.DROP_IN_NAME).read_text() == "precious\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == [plan.DROP_IN_NAME]


def test_the_drop_in_sorts_after_an_override_conf_as_systemd_applies_them(tmp_path: Path) -> None:
    """systemd applies drop-ins in the lexical order of their names across the unit's .d directories: an
    override.conf (`systemctl edit`) with a command that cannot run, and the plan's drop-in: systemd-analyze
    verify loads the unit, so the plan's ExecStart= is the one that counts. The old name loses."""
    for name, expected in ((plan.DROP_IN_NAME, 0), ("50-vllm-xpu-plan.conf", 1)):
        units = tmp_path / name
        (units / "x.service.d").mkdir(parents=True)
        (units / "x.service").write_text("[Service]\nExecStart=/bin/true\n")
        (units / "x.service.d" / "override.conf").write_text("[Service]\nExecStart=\nExecStart=/nonexistent/vllm\n")
        (units / "x.service.d" / name).write_text("[Service]\nExecStart=\nExecStart=/bin/true planned\n")
        result = subprocess.run(["/usr/bin/systemd-analyze", "verify", "--man=no", "--recursive-errors=no", "x.service"],
                                capture_output=True, text=True, timeout=60, check=False,
                                env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"})
        assert result.returncode == expected, (name, result.stderr)


def test_nixos_values_per_unit(journal: Path) -> None:
    result = run_plan(journal, "--requests", f"{CHAT}=1", "--format", "nixos")
    assert result.returncode == plan.EXIT_INCOMPLETE
    document = json.loads(run_plan(journal, "--requests", f"{CHAT}=1", "--format", "json").stdout)
    chat = next(u for u in document["devices"][0]["units"] if u["unit"] == CHAT)
    assert (f'  "vllm-xpu-chat" = {{ kvCacheMemoryBytes = {chat["kv_cache_memory_bytes"]}; '
            f'gpuMemoryUtilization = {chat["gpu_memory_utilization"]:g}; }};') in result.stdout.splitlines()
    assert "mkForce" not in result.stdout and "/nix/store" not in result.stdout and "ExecStart" not in result.stdout


@pytest.mark.parametrize("argv", [
    ["--device-memory", "lots"],
    ["--tokens", "chat"],
    ["--requests", "chat=0"],
    ["--format", "yaml"],
    ["--output-dir", "/tmp/x"],
    ["--device-memory", "100", "--reserve", "200"],
    ["--tokens", "chat=5", "--requests", "chat=2"],
    ["--systemctl", "systemctl"],
    ["--device-core-memory", "16GiB"],
    ["--device-memory", "16GiB", "--device-core-memory", "17GiB"],
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", *argv], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "vllm-xpu-plan: error:" in result.stderr


# --- pure parts ----------------------------------------------------------------------------------------

@pytest.mark.fast
def test_planned_command_replaces_both_flag_spellings() -> None:
    unit = plans.UnitPlan("u.service", "offline", "0.24.0", plans.Target(10, "t"), 16, 1.0,
                         memory_rules.Footprint(100, 200), "x", 0.25)
    command = plan.planned_command("vllm serve m --gpu_memory_utilization=0.9 --kv-cache-memory-bytes 5 --port 1", unit)
    assert command == "vllm serve m --port 1 --gpu-memory-utilization 0.25 --kv-cache-memory-bytes 200"


@pytest.mark.fast
def test_main_reports_an_unreadable_journal_in_one_line(tmp_path: Path) -> None:
    err = io.StringIO()
    out = io.StringIO()
    code = plan.main(["--journal.directory", str(tmp_path / "none"), "--device-memory", "17179869184"],
                     stdout=out, stderr=err)
    assert code == plan.EXIT_USAGE and out.getvalue() == "", out.getvalue()
    assert err.getvalue().count("\n") == 1, err.getvalue()
    assert err.getvalue().startswith("vllm-xpu-plan: error: cannot read the journal (journal directory "), err.getvalue()


# --- the same figures from the exporter ------------------------------------------------------------------

def planned_series(samples: dict) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    def by_unit(name: str) -> dict[str, float]:
        return {dict(labels)["unit"]: value for labels, value in series(samples, name).items()}
    return (by_unit("xpu_unit_memory_footprint_bytes"), by_unit("xpu_unit_kv_cache_planned_bytes"),
            {dict(labels)["device"]: value for labels, value in series(samples, "xpu_device_units_footprint_bytes").items()})


def scrape_planned(journal: Path, tmp_path: Path, fake_driver: Path, config_path: Path) -> dict:
    """A scrape of the exporter over the journal and the fake driver's 16 GiB GPU, once the plan's figures show."""
    gpu = replace(A770, memory=(FakeMemoryModule(size=SIXTEEN_GIB, free=SIXTEEN_GIB - GiB),))
    write_config(config_path, FakeConfig(devices=(gpu,)))
    procfs = FakeProcfs(tmp_path)
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal)],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        return wait_for(lambda: (s := exporter.scrape()) and series(s, "xpu_device_units_footprint_bytes") and s)


def test_the_exporter_shows_the_planners_figures_per_unit_and_gpu(journal: Path, tmp_path: Path, fake_driver: Path,
                                                                  config_path: Path) -> None:
    """The planner's default target (the KV of the last successful start), to the byte, both planning with the
    total vLLM multiplies (the fake driver's core total, 0.95 of Sysman's: chat's 0.24 start printed no total, so
    its non-KV memory is ceil(that total x R) - KV); the unit on 0.15.1 has no plan, so no series."""
    core = SIXTEEN_GIB * 95 // 100
    [device] = json.loads(run_plan(journal, "--device-core-memory", str(core), "--format", "json").stdout)["devices"]
    footprints, planned_kv, device_sums = planned_series(scrape_planned(journal, tmp_path, fake_driver, config_path))
    assert footprints == {u["unit"]: u["footprint_bytes"] for u in device["units"]}
    assert planned_kv == {u["unit"]: u["kv_cache_memory_bytes"] for u in device["units"]}
    assert LEGACY not in footprints
    assert device_sums == {A770.pci_address: device["footprint_bytes"]}


def test_a_unit_with_a_kv_budget_is_planned_for_what_its_budget_holds(tmp_path: Path, fake_driver: Path,
                                                                      config_path: Path) -> None:
    """The plan applied: chat's latest start has --kv-cache-memory-bytes, and the exporter's planned KV is
    its budget, to the byte."""
    budget = 3_500_000_000
    runs = {**seed_runs(), CHAT: replace(race_chat_runs()[1], kv_cache_memory_bytes=budget)}
    del runs[LEGACY]
    journal = write_journal(tmp_path / "budget.journal", journal_specs(seed_placed(runs)))
    start = latest_starts(runs)[CHAT]
    footprints, planned_kv, device_sums = planned_series(scrape_planned(journal, tmp_path, fake_driver, config_path))
    assert planned_kv[CHAT] == budget
    # 0.24 prints only the weights beside a budget, and no start of it ran without one
    assert footprints[CHAT] == memory_rules.printed_upper_bound(start.weights_bytes) + budget
    assert device_sums == {A770.pci_address: sum(footprints.values())} and sum(footprints.values()) < SIXTEEN_GIB


def test_a_plan_that_does_not_fit_writes_no_drop_in(journal: Path, tmp_path: Path) -> None:
    """Three full-length chat requests do not fit: their drop-ins would make the units fail at every start."""
    out = tmp_path / "drop-ins"
    result = run_plan(journal, "--requests", f"{CHAT}=3", "--format", "systemd", "--output-dir", str(out),
                      "--systemctl", "/nonexistent/systemctl")
    assert result.returncode == 1
    assert not out.exists()
    assert f"nothing written to {out}: the plan does not fit" in result.stderr


@pytest.mark.fast
def test_the_exporters_plan_is_kept_while_its_figures_hold_and_made_again_when_a_start_changes() -> None:
    """The processes collector keeps a unit's plan between scrapes (attribution.Plans): the fold hands out fresh
    snapshots every time, so the plan is kept by the starts' figures, and a start with other figures is planned
    again."""
    from vllm_xpu_exporter.attribution import Plans

    cache = Plans()
    runs = {CHAT: race_chat_runs()[1]}
    view = next(v for v in unit_views(runs) if v.unit == CHAT)
    again = next(v for v in unit_views(runs) if v.unit == CHAT)
    assert again.latest is not view.latest
    first = cache.plan(view, "0000:03:00.0", SIXTEEN_GIB)
    assert cache.plan(again, "0000:03:00.0", SIXTEEN_GIB) is first
    budgeted = next(v for v in unit_views({CHAT: replace(race_chat_runs()[1], kv_cache_memory_bytes=3_500_000_000)})
                    if v.unit == CHAT)
    replanned = cache.plan(budgeted, "0000:03:00.0", SIXTEEN_GIB)
    assert replanned.kv_cache_memory_bytes == 3_500_000_000 != first.kv_cache_memory_bytes
    assert cache.plan(view, "0000:03:00.0", 2 * SIXTEEN_GIB) is not first  # another total


# --- the budget's figures (issue 26) ---------------------------------------------------------------------

def views_of(unit_runs: dict[str, list[VllmRun]]) -> dict[str, object]:
    """Each unit's runs, each started anew (by hand) a while after the one before."""
    boot_at = 1_747_044_600.0
    planned = []
    for index, (unit, runs) in enumerate(unit_runs.items()):
        for number, run in enumerate(runs):
            planned += service_runs(unit, [run], boot_at + 60 + number * 600 + index * 0.001, job_id=120 + index + 10 * number)
    tracker = EngineTracker()
    tracker.extend(tracker_entries(compose(Boot(current_boot_id(), boot_at, tuple(planned)))))
    return {view.unit: view for view in tracker.views()}


def chat_plan(runs: list[VllmRun], total: int = SIXTEEN_GIB, **target: int) -> plans.UnitPlan:
    result = plans.plan_unit(views_of({CHAT: runs})[CHAT], "offline", total,
                                plans.TargetRequest(**target) if target else None)
    assert isinstance(result, plans.UnitPlan), result
    return result


@pytest.mark.fast
def test_cuda_graph_memory_of_0_34_is_counted_in_the_non_kv_memory() -> None:
    restarted = replace(race_chat_runs()[1], version="0.34.0")
    without = chat_plan([restarted], requests=1)
    with_graphs = chat_plan([replace(restarted, cudagraph_gib=0.35)], requests=1)
    assert "CUDA graphs" in with_graphs.non_kv_from
    assert with_graphs.footprint.non_kv_bytes - without.footprint.non_kv_bytes == memory_rules.printed_upper_bound(round(0.35 * GiB))
    assert with_graphs.kv_cache_memory_bytes == without.kv_cache_memory_bytes


@pytest.mark.fast
def test_re_planning_after_a_plan_is_applied_keeps_the_non_kv_memory_and_reads_the_exact_budget() -> None:
    """The latest start ran with --kv-cache-memory-bytes (no summary, a rounded "reserved" line): the non-KV
    memory is the earlier start's (not the weights alone), the KV figures the exact budget's."""
    profiled = replace(race_chat_runs()[1], version="0.28.0")
    budget = 3_400_000_123
    applied = replace(profiled, kv_cache_memory_bytes=budget, kv_cache_tokens=budget // (64 * 24576) * 64,
                      main_pid=2401)
    before = chat_plan([profiled], requests=1)
    after = chat_plan([profiled, applied], requests=1)
    assert after.footprint.non_kv_bytes == before.footprint.non_kv_bytes
    assert "earlier start" in after.non_kv_from and "weights only" not in after.non_kv_from
    assert after.kv_from == "its --kv-cache-memory-bytes (exact)"
    assert after.kv_blocks.block_bytes == budget * 64 // applied.kv_cache_tokens


@pytest.mark.fast
def test_tokens_beyond_what_the_start_held_say_they_extrapolate() -> None:
    held = race_chat_runs()[1].kv_cache_tokens
    assert "extrapolated beyond the 136960 tokens" in chat_plan([race_chat_runs()[1]], tokens=held + 64).target.reason
    assert "extrapolated" not in chat_plan([race_chat_runs()[1]], tokens=held).target.reason


@pytest.mark.fast
def test_the_derived_non_kv_memory_uses_the_total_the_starts_printed_for_another_device_size() -> None:
    """0.24 prints no split: non-KV = ceil(total x R) - KV, with the total of the device the start ran on
    (printed by its free-memory failure), not the size planned for: right for a 12 GiB plan too."""
    failed = replace(race_chat_runs()[1], failure=Failure("insufficient_free_memory", free_gib=3.1, total_gib=15.91),
                     main_pid=2300)
    runs = [failed, race_chat_runs()[1]]
    on_16 = chat_plan(runs, requests=1)
    on_12 = chat_plan(runs, total=12 * GiB, requests=1)
    assert on_12.footprint.non_kv_bytes == on_16.footprint.non_kv_bytes
    ran_on = memory_rules.printed_upper_bound(round(15.91 * GiB))
    assert on_16.footprint.non_kv_bytes == math.ceil(ran_on * 0.75) - memory_rules.printed_lower_bound(round(3.25 * GiB))
    # without a printed total the figure is the planned size's, and the plan says so
    alone = chat_plan([race_chat_runs()[1]], total=12 * GiB, requests=1)
    assert any("right only if its starts ran on a device of that size" in note for note in alone.notes)


@pytest.mark.fast
def test_a_derived_non_kv_memory_at_or_below_zero_is_not_planned() -> None:
    result = plans.plan_unit(views_of({CHAT: [race_chat_runs()[1]]})[CHAT], "offline", 4 * GiB,
                                plans.TargetRequest(requests=1))
    assert isinstance(result, plans.Unplannable)


def test_device_memory_other_than_the_printed_total_is_said(tmp_path: Path) -> None:
    runs = {CHAT: replace(race_chat_runs()[1], version="0.28.0", total_gib=15.11)}
    journal = write_journal(tmp_path / "a770.journal", journal_specs(seed_placed(runs)))
    result = run_plan(journal, "--requests", f"{CHAT}=1")
    assert result.returncode == 0, result.stderr
    assert (f"--device-memory {SIXTEEN_GIB} (16.00 GiB) is not the total the starts of {CHAT} printed (15.11 GiB)"
            in result.stderr)
    # without Level Zero and without --device-memory: the total the starts printed, at its least
    result = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(journal),
                             "--levelzero.library", str(tmp_path / "no-libze_loader.so.1"), "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    [device] = json.loads(result.stdout)["devices"]
    assert device["total_bytes"] == memory_rules.printed_lower_bound(round(15.11 * GiB))
    assert "Level Zero cannot be read: planning for the total the starts printed" in result.stderr


def test_a_journal_without_vllm_lines_plans_nothing_and_exits_3(tmp_path: Path) -> None:
    journal = write_journal(tmp_path / "empty.journal",
                            journal_specs(compose(Boot(current_boot_id(), 1_747_044_600.0, ()))))
    result = run_plan(journal)
    assert result.returncode == plan.EXIT_INCOMPLETE
    assert len(result.stderr.splitlines()) == 1 and "nothing planned" in result.stderr


def test_only_units_before_0_16_exit_3(tmp_path: Path) -> None:
    journal = write_journal(tmp_path / "legacy.journal", journal_specs(seed_placed({LEGACY: seed_runs()[LEGACY]})))
    result = run_plan(journal)
    assert result.returncode == plan.EXIT_INCOMPLETE
    assert "incomplete: nothing was planned" in result.stderr


def test_right_after_a_failing_cold_boot_the_default_takes_chats_last_good_kv_from_an_earlier_boot(
        tmp_path: Path) -> None:
    """The issue's: the current boot holds only chat's failing start ("2.13 GiB" available, below one
    request); the default used to print "fits" with chat left out of the sum. Now chat's last successful
    start is found in the earlier boot the journal holds, the plan says which, and chat is in the sum. And the
    failure is learnt from: it said one request of 131072 tokens needs 3.36 GiB, more than the 3.25 GiB the last
    good start had, so the budget is raised to what the failure said (its print's upper end) and the null
    block: the KV of the last good start alone would fail with the same message at every start."""
    failed, restarted = race_chat_runs()
    earlier_at, current_at = 1_747_000_000.0, 1_747_044_600.0
    earlier = [*service_runs(CHAT, [restarted], earlier_at + 60, job_id=120),
               *service_runs(EMBEDDING, [race_embedding_run()], earlier_at + 60.001, job_id=121),
               *service_runs(STT, [race_stt_run()], earlier_at + 60.002, job_id=122)]
    current = [*service_runs(CHAT, [replace(failed, failure=Failure("kv_cache_too_small", needed_gib=3.36))],
                             current_at + 60, job_id=120),
               *service_runs(EMBEDDING, [race_embedding_run()], current_at + 60.001, job_id=121),
               *service_runs(STT, [race_stt_run()], current_at + 60.002, job_id=122)]
    journal = write_journal(tmp_path / "two-boots.journal", journal_specs(compose(
        Boot("0123456789abcdef0123456789abcdef", earlier_at, tuple(earlier)),
        Boot(current_boot_id(), current_at, tuple(current)))))
    result = run_plan(journal, "--format", "json")
    assert result.returncode == 0, result.stderr
    [device] = json.loads(result.stdout)["devices"]
    chat = next(u for u in device["units"] if u["unit"] == CHAT)
    assert chat["target"] == "the KV its last successful start had (began 2025-05-11 21:47:40 UTC)"
    need = memory_rules.printed_upper_bound(round(3.36 * GiB))
    assert chat["kv_cache_memory_bytes"] == need + chat["kv_block_bytes"]
    assert any("needs (3.36 GiB printed, at its upper end)" in note for note in chat["notes"])
    assert device["footprint_bytes"] == sum(u["footprint_bytes"] for u in device["units"]) > 12 * GiB


def test_the_output_directory_is_not_reached_through_a_link_another_user_can_swap(journal: Path,
                                                                                  tmp_path: Path) -> None:
    """/tmp-like: another user's link in a directory everyone may write to, pointing at root's directory of
    drop-ins. Followed, its owner would choose where root writes."""
    os.chmod(tmp_path, 0o755)
    systemd_dir = tmp_path / "system"
    systemd_dir.mkdir(mode=0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "out").symlink_to(systemd_dir)
    os.lchown(shared / "out", 65534, 65534)
    argv = ["--requests", f"{CHAT}=1", "--format", "systemd", "--systemctl",
            str(fake_systemctl(tmp_path, SEED_COMMANDS))]
    result = run_plan(journal, *argv, "--output-dir", str(shared / "out"))
    assert result.returncode == plan.EXIT_USAGE and list(systemd_dir.iterdir()) == [], result.stderr
    assert f"{shared / 'out'} is a symlink owned by uid 65534" in result.stderr
    assert "Traceback" not in result.stderr
    os.lchown(shared / "out", 0, 0)  # root's own link: nobody else may remove or swap it
    written = run_plan(journal, *argv, "--output-dir", str(shared / "out"))
    assert written.returncode == plan.EXIT_INCOMPLETE and (systemd_dir / f"{CHAT}.d" / plan.DROP_IN_NAME).exists()


def test_an_output_directory_through_proc_pid_root_is_written_in_that_processs_mount_namespace(
        journal: Path, tmp_path: Path) -> None:
    """`/proc/PID/root/DIR`, as a test writes into a booted systemd's /etc/systemd/system: the kernel's link lands
    in PID's mount namespace, where a tmpfs covers DIR. Its text (`/`) is the host's root: the drop-ins belong in
    the namespace's DIR and the host's stays empty."""
    os.chmod(tmp_path, 0o755)
    host_dir = tmp_path / "system"
    host_dir.mkdir(mode=0o755)
    argv = ["--requests", f"{CHAT}=1", "--format", "systemd", "--systemctl", str(fake_systemctl(tmp_path, SEED_COMMANDS))]
    with tmpfs_in_own_mount_namespace(host_dir) as pid:
        inside = Path(f"/proc/{pid}/root") / str(host_dir).lstrip("/")
        result = run_plan(journal, *argv, "--output-dir", str(inside))
        assert result.returncode == plan.EXIT_INCOMPLETE, result.stderr  # the unit on 0.15.1 is left out
        assert (inside / f"{CHAT}.d" / plan.DROP_IN_NAME).is_file()
        assert f"{inside}/{CHAT}.d/{plan.DROP_IN_NAME}" in result.stdout.splitlines()
    assert list(host_dir.iterdir()) == []


# --- what a plan that does not fit prints, and what it counts -------------------------------------------------

@pytest.mark.parametrize("output", ["systemd", "nixos"])
def test_a_plan_that_does_not_fit_prints_nothing_to_paste_and_exits_1(journal: Path, tmp_path: Path,
                                                                      output: str) -> None:
    """40 full-length chat requests: more than the GPU. No drop-in or snippet to paste (one said
    --gpu-memory-utilization 1 for chat), only what does not fit, on stderr."""
    result = run_plan(journal, "--requests", f"{CHAT}=40", "--format", output,
                      "--systemctl", str(fake_systemctl(tmp_path, SEED_COMMANDS)))
    assert result.returncode == plan.EXIT_DOES_NOT_FIT, result.stderr
    assert result.stdout == ""
    assert "nothing printed: the plan does not fit" in result.stderr
    assert "GPU offline does not fit: " in result.stderr
    assert f"GPU offline: {CHAT}'s footprint" in result.stderr
    assert "no --gpu-memory-utilization below 1" in result.stderr


def test_no_planned_r_is_1_or_more(journal: Path) -> None:
    """A footprint beyond the total vLLM multiplies has no R: null in JSON, '-' in the table, and its GPU does not
    fit (vLLM can never give it that much), whatever the bytes left."""
    result = run_plan(journal, "--requests", f"{CHAT}=40", "--format", "json")
    document = json.loads(result.stdout)
    [device] = document["devices"]
    chat = next(u for u in device["units"] if u["unit"] == CHAT)
    assert chat["footprint_bytes"] > SIXTEEN_GIB and chat["gpu_memory_utilization"] is None
    assert all(u["gpu_memory_utilization"] is None or u["gpu_memory_utilization"] < 1 for u in device["units"])
    assert not device["fits"] and not document["fits"]
    assert any("no --gpu-memory-utilization below 1" in reason for reason in device["does_not_fit"])
    table = run_plan(journal, "--requests", f"{CHAT}=40").stdout
    [row] = [line for line in table.splitlines() if line.startswith(f"  {CHAT} ")]
    assert " - " in row and " 1 " not in row


@pytest.mark.fast
def test_a_unit_left_out_is_counted_from_any_start_that_says_its_r_else_the_fit_is_not_claimed() -> None:
    """chat's latest start printed no version (it has only begun): it cannot be planned. Its last successful start
    says R 0.75: it is counted at ceil(0.75 x total), as docs/planner.md says. With no start saying an R its
    memory is not known: the GPU is not said to fit (it was: chat left out of the sum, the GPU "fits")."""
    view = views_of({CHAT: [race_chat_runs()[1]]})[CHAT]
    begun = replace(view.latest, version=None, gpu_memory_utilization=None, began_usec=view.latest.began_usec + 1)
    just_begun = replace(view, latest=begun)
    totals = {"gpu": plans.Totals(SIXTEEN_GIB, SIXTEEN_GIB * 95 // 100)}
    [device] = plans.make_plan([just_begun], totals, {}, 512 << 20, {}).devices
    [left_out] = device.unplannable
    assert left_out.held_bytes == math.ceil(SIXTEEN_GIB * 95 // 100 * 0.75) == device.left_out_bytes
    assert "its last successful start" in left_out.held_from and device.fits
    unknown = replace(just_begun, last_success=replace(view.last_success, version=None, gpu_memory_utilization=None),
                      last_profiled=None)
    [device] = plans.make_plan([unknown], totals, {}, 512 << 20, {}).devices
    assert device.uncounted and not device.fits and device.fit.fits
