"""The planner's container outputs applied as written to real engines (tests/containerengines.py): the replayed
engines (tests/vllmunit.py, inside the test image, on the fake GPU) then run with the planned budget, so the KV
cache each prints is the plan's, to the byte.

- Compose: Debian's docker-compose 1.29 on a dockerd of the run's own starts the seed's three engines as one
  project's services (json-file logs), one after another; the planner reads their starts from the logs, writes the
  override (`--format compose`), and `docker-compose -f compose.yaml -f override up -d` recreates them with it.
- Podman: a container made by `podman run`, its create command read from real Podman, planned, and run as
  printed (`podman run --replace ...`); its plan is given: a budget three blocks below the KV the engine had.

"Is the plan applied?" (docs/containers.md): the exporter, reading the engines' records of the containers
(Docker's config.v2.json labels, Podman's OCI config.json annotations) and their logs, shows each planned
container's plan (xpu_unit_kv_cache_plan_bytes) equal to the budget its engine printed
(xpu_unit_kv_cache_budget_bytes), and the bundled XpuUnitPlanNotApplied expression, evaluated by promtool, empty;
the Podman line run again with its command's budget changed by hand (the plan's record kept) makes it name that
container.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from containerengines import IMAGE_NAME, PODMAN, ULIMITS
from fakeze import SharedDevice
from journalgen import write_journal
from polling import wait_for
from vllm_xpu_exporter.planner import containers
from vllm_xpu_exporter.planner.plans import Target, UnitPlan
from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.sources import container_commands
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, Engine, engine_command, read_events
from exporterproc import RunningExporter
from fakeze import fake_driver_env
from scrapes import Samples, series
from test_containers_real_engines import EXPORTER
from test_planner_applied_real_systemd import promtool_finds

REPO = Path(__file__).resolve().parents[2]
COMPOSE = "/usr/bin/docker-compose"
TIME_SCALE = 0.1
SERVING = (CHAT, EMBEDDING, STT)
STEP_TIMEOUT = 60.0


def device(directory: Path) -> tuple[Path, Path, Path, int]:
    """The fake GPU's config, the events file, a PYTHONPATH with the checkout's exporter, the GPU's total."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "ze.conf"
    SharedDevice.create(config, SIXTEEN_GIB_GPU)
    pythonpath = directory / "pythonpath"
    pythonpath.mkdir()
    (pythonpath / "vllm_xpu_exporter").symlink_to(REPO / "exporter")
    return config, directory / "events.jsonl", pythonpath, SIXTEEN_GIB_GPU.memory[0].size


def serving_after(events: Path, name: str, seen: int) -> dict | None:
    """The `serving` record of engine `name` among the events after the first `seen`."""
    return next((r for r in read_events(events)[seen:] if r["unit"] == name and r["event"] == "serving"), None)


def wait_serving(events: Path, name: str, seen: int = 0) -> dict:
    record = wait_for(lambda: serving_after(events, name, seen), timeout=STEP_TIMEOUT, interval=0.1)
    assert record, f"{name}: not serving within {STEP_TIMEOUT:.0f} s: {read_events(events)[seen:]}"
    return record


def plans_and_budgets(args: list[str], fake_driver: Path, config: Path, keys: set[str]) -> Samples:
    """A scrape of the exporter reading the engines' state and logs (`args`) once every container of `keys` has
    its plan and its printed budget."""
    def both(samples: Samples) -> bool:
        return all(keys <= {dict(labels)["unit"] for labels in series(samples, name)}
                   for name in ("xpu_unit_kv_cache_plan_bytes", "xpu_unit_kv_cache_budget_bytes"))

    with RunningExporter(["--journal.boot", "all", *args], env=fake_driver_env(fake_driver, config),
                         command=EXPORTER) as exporter:
        samples = wait_for(lambda: (scraped := exporter.scrape()) and both(scraped) and scraped, timeout=30,
                           interval=0.5)
        assert samples, f"no plan and budget of {keys}: {exporter.scrape()}\n{exporter.stderr}"
    return samples


def by_unit(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["unit"]: value for labels, value in series(samples, name).items()}


def test_the_compose_override_applied_as_written_gives_engines_whose_kv_is_the_plans(tmp_path, dockerd, fake_driver):
    config, events, pythonpath, total = device(tmp_path / "device")
    names = {engine.role: f"vllm-{engine.role}" for engine in SERVING}
    project = tmp_path / "project"
    project.mkdir()
    compose_file = project / "compose.yaml"
    compose_file.write_text(yaml.safe_dump({"services": {engine.role: {
        "image": IMAGE_NAME, "container_name": names[engine.role], "network_mode": "none", "pid": "host",
        "command": engine_command(engine, names[engine.role], device_config=config, time_scale=TIME_SCALE,
                                  events=events, python="python3", requests=0),
        "volumes": [f"{tmp_path}:{tmp_path}", f"{REPO}:{REPO}:ro"], "environment": {"PYTHONPATH": str(pythonpath)},
        "logging": {"driver": "json-file"}} for engine in SERVING}}))
    env = {**os.environ, "DOCKER_HOST": f"unix://{dockerd.socket}"}
    compose = [COMPOSE, "-p", "planned", "-f", str(compose_file)]
    dockerd.remove(*names.values())
    try:
        for engine in SERVING:  # one after another: each start's KV is its own
            subprocess.run([*compose, "up", "-d", engine.role], env=env, check=True, capture_output=True, timeout=120)
            wait_serving(events, names[engine.role])
        plan = [sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file",
                str(write_journal(tmp_path / "empty.journal", [])), "--journal.boot", "all",
                "--path.docker", str(dockerd.data_root), "--logs.docker", "--device-memory", str(total)]
        planned = subprocess.run([*plan, "--format", "json"], capture_output=True, text=True, timeout=120)
        assert planned.returncode == 0, planned.stderr
        budgets = {u["unit"]: u["kv_cache_memory_bytes"]
                   for d in json.loads(planned.stdout)["devices"] for u in d["units"]}
        assert set(budgets) == {f"docker/{name}" for name in names.values()}
        written = subprocess.run([*plan, "--format", "compose"], capture_output=True, text=True, timeout=120, env=env)
        assert written.returncode == 0, written.stderr
        override = tmp_path / "override.yaml"
        override.write_text(written.stdout)
        seen = len(read_events(events))
        subprocess.run([*compose, "-f", str(override), "up", "-d"], env=env, check=True, capture_output=True,
                       timeout=120)
        for engine in SERVING:
            record = wait_serving(events, names[engine.role], seen)
            assert record["kv_bytes"] == budgets[f"docker/{names[engine.role]}"], record
        # the plan applied: Docker recorded the override's label with each container, its engine printed the budget
        samples = plans_and_budgets(["--journal.file", str(tmp_path / "empty.journal"), "--logs.docker",
                                     "--path.docker", str(dockerd.data_root)], fake_driver, config, set(budgets))
        assert {unit: plan for unit, plan in by_unit(samples, "xpu_unit_kv_cache_plan_bytes").items()
                if unit in budgets} == budgets == by_unit(samples, "xpu_unit_kv_cache_budget_bytes")
        checked = promtool_finds(samples, tmp_path, {})
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        subprocess.run([*compose, "down", "-t", "1"], env=env, capture_output=True, timeout=120)


def test_the_podman_line_run_as_printed_gives_an_engine_whose_kv_is_the_plans(tmp_path, podman, fake_driver):
    config, events, pythonpath, _ = device(tmp_path / "device")
    engine, name = STT, "vllm-planned-stt"
    podman.remove(name)
    podman.run(name, engine_command(engine, name, device_config=config, time_scale=TIME_SCALE, events=events,
                                    python="python3", requests=0),
               log_driver="k8s-file", volumes=[tmp_path], options=["-v", f"{REPO}:{REPO}:ro",
                                                                    "--env", f"PYTHONPATH={pythonpath}"])
    try:
        first = wait_serving(events, name)
        # the planner asks `--podman PATH` alone: this run's Podman, with its own storage, behind one path
        wrapper = tmp_path / "podman"
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.join(podman.command())} \"$@\"\n")
        wrapper.chmod(0o755)
        command = container_commands.podman_command(f"podman/{name}", str(wrapper))
        assert isinstance(command, container_commands.ContainerCommand), command
        budget = first["kv_bytes"] - 3 * 64 * engine.kv_bytes_per_token  # three blocks fewer than it ran with
        plan = UnitPlan(f"podman/{name}", "offline", "0.24.0", Target(5440, "test"), 64, 1.0,
                        memory_rules.Footprint(non_kv_bytes=1 << 29, kv_bytes=budget), "test", 0.0707)
        line = containers.podman_command_line(plan, command)
        assert shlex.split(line)[:len(podman.command()) + 2] == [*podman.command(), "run", "--replace"]
        seen = len(read_events(events))
        subprocess.run(shlex.split(line), check=True, capture_output=True, timeout=120)
        record = wait_serving(events, name, seen)
        assert record["kv_bytes"] == budget, record
        key, args = f"podman/{name}", ["--journal.file", str(write_journal(tmp_path / "empty.journal", [])),
                                       "--logs.podman", "--path.podman", str(podman.storage)]
        samples = plans_and_budgets(args, fake_driver, config, {key})
        assert by_unit(samples, "xpu_unit_kv_cache_plan_bytes")[key] == budget
        assert by_unit(samples, "xpu_unit_kv_cache_budget_bytes")[key] == budget
        checked = promtool_finds(samples, tmp_path, {})
        assert checked.returncode == 0, checked.stdout + checked.stderr
        # the same line with the command's budget changed by hand: the record still says the plan, the engine not
        words, own = shlex.split(line), budget - 64 * engine.kv_bytes_per_token  # a block fewer
        words[len(words) - words[::-1].index("--kv-cache-memory-bytes")] = str(own)
        seen = len(read_events(events))
        subprocess.run(words, check=True, capture_output=True, timeout=120)
        wait_serving(events, name, seen)
        samples = plans_and_budgets(args, fake_driver, config, {key})
        assert by_unit(samples, "xpu_unit_kv_cache_budget_bytes")[key] == own
        checked = promtool_finds(samples, tmp_path, {key: budget})  # the alert names it, with its plan
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        podman.remove(name)
