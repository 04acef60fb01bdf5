"""The distribution as `pip install .` lays it out: one top-level import package, `vllm_xpu_exporter`, built
from the source folder exporter/ with every package below it, and no `exporter` (a name any other
distribution could install too). Installed for real, from a copy of the source, into a target directory."""

from __future__ import annotations

import email.parser
import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install --no-deps --target` of a copy of what the distribution is built from (a build in the
    clone would leave build/ and egg-info behind)."""
    root = tmp_path_factory.mktemp("distribution")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "SECURITY.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "exporter", source / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs", source / "docs")  # installed as the documentation (data files)
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                    str(target), str(source)], check=True, capture_output=True, timeout=300)
    return target


def test_pip_install_puts_vllm_xpu_exporter_and_no_exporter_package_into_site_packages(installed):
    # --target puts the scripts (bin/) and the data files (share/, the documentation) beside the packages
    top_level = {path.name for path in installed.iterdir()
                 if path.is_dir() and not path.name.endswith((".dist-info", ".egg-info"))
                 and path.name not in ("bin", "share")}
    assert top_level == {"vllm_xpu_exporter"}


def test_every_package_below_the_source_folder_is_installed(installed):
    source_packages = {init.parent.relative_to(REPO / "exporter")
                       for init in (REPO / "exporter").rglob("__init__.py")}
    installed_packages = {init.parent.relative_to(installed / "vllm_xpu_exporter")
                          for init in (installed / "vllm_xpu_exporter").rglob("__init__.py")}
    assert installed_packages == source_packages
    source_modules = {path.relative_to(REPO / "exporter") for path in (REPO / "exporter").rglob("*.py")}
    installed_modules = {path.relative_to(installed / "vllm_xpu_exporter")
                         for path in (installed / "vllm_xpu_exporter").rglob("*.py")}
    assert installed_modules == source_modules


def test_the_installed_console_scripts_import_the_renamed_package(installed):
    scripts = {path.name: path.read_text() for path in (installed / "bin").iterdir()}
    assert {"vllm-xpu-exporter", "vllm-xpu-gate", "vllm-xpu-plan"} <= scripts.keys()
    assert all("from vllm_xpu_exporter." in text for text in scripts.values())
    code = "import vllm_xpu_exporter.cli, vllm_xpu_exporter.gate.cli, vllm_xpu_exporter.planner.cli; " \
           "print(vllm_xpu_exporter.__file__)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=installed,
                              env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()) == installed / "vllm_xpu_exporter" / "__init__.py"


# sha256 of the Apache License 2.0 as the Apache Software Foundation publishes it
# (https://www.apache.org/licenses/LICENSE-2.0.txt, 202 lines, its appendix included)
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_licence_file_is_the_complete_apache_2_0_text():
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert b"END OF TERMS AND CONDITIONS" in text and b"APPENDIX: How to apply the Apache License" in text


def test_the_metadata_carries_an_spdx_licence_expression_and_the_licence_file(installed):
    """PEP 639: `License-Expression` and `License-File` in the metadata, the file itself in the dist-info;
    no legacy `License:` field (the `license = { text = … }` table setuptools deprecates)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert pyproject["license"] == "Apache-2.0" and pyproject["license-files"] == ["LICENSE"]
    (dist_info,) = installed.glob("vllm_xpu_exporter-*.dist-info")
    metadata = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None
    assert (dist_info / "licenses" / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()


def test_the_description_names_units_containers_and_pods(installed):
    (dist_info,) = installed.glob("vllm_xpu_exporter-*.dist-info")
    summary = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())["Summary"]
    assert all(word in summary for word in ("systemd units", "containers", "pods")), summary


def test_the_runbook_the_exporter_serves_is_installed_with_it(installed):
    assert ((installed / "vllm_xpu_exporter" / "http" / "runbook.md").read_text()
            == (REPO / "docs" / "runbook.md").read_text())


# ------------------------------------------------------------------------------------- without a clone

def tracked_tree(destination: Path) -> Path:
    """The files of the clone that git tracks or would (not what it ignores: .venv, build/, node_modules),
    links kept as links: what a fresh clone holds."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git clone: the distribution is built from a clone's files (git ls-files)")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_symlink() or (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name, follow_symlinks=False)
    return destination


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A wheel built from a copy of the clone, installed into a new virtual environment (its dependencies are
    this one's, by a .pth file: nothing is fetched for them), as `pip install vllm-xpu-exporter` would."""
    root = tmp_path_factory.mktemp("wheel")
    source = tracked_tree(root / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (root / "dist").glob("vllm_xpu_exporter-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path("
                                   "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    return venv


@pytest.mark.parametrize("name, source", [
    ("rules", "rules/vllm-xpu-exporter.yaml"), ("dashboard", "grafana/vllm-xpu-exporter.json"),
    *((unit, f"packaging/{unit}") for unit in ("vllm-xpu-exporter.service", "vllm-xpu-exporter.default",
                                               "vllm-xpu-gate.service", "vllm-xpu-gate.socket", "vllm-xpu-gate.conf")),
])
def test_a_wheel_install_prints_the_rules_dashboard_and_units_as_the_repository_has_them(fresh_venv, tmp_path,
                                                                                        name, source):
    printed = subprocess.run([fresh_venv / "bin" / "vllm-xpu-exporter", "print", name], capture_output=True,
                             cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (REPO / source).read_bytes()


def test_print_lists_what_it_prints_and_refuses_another_name_in_one_line(fresh_venv):
    listed = subprocess.run([fresh_venv / "bin" / "vllm-xpu-exporter", "print", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0 and "rules" in listed.stdout and "vllm-xpu-gate.conf" in listed.stdout
    refused = subprocess.run([fresh_venv / "bin" / "vllm-xpu-exporter", "print", "alerts"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
    assert "unknown name 'alerts'" in refused.stderr


# The venv the packaged units run from (their ExecStart=): the wheel's data files are under it too
PACKAGED_PREFIX = "/opt/vllm-xpu-exporter"
INSTALLED_DOCS = "share/doc/vllm-xpu-exporter"
PACKAGED_UNITS = ("vllm-xpu-exporter.service", "vllm-xpu-exporter.socket", "vllm-xpu-gate.service",
                  "vllm-xpu-gate.socket")


def documentation_of(unit: str) -> list[str]:
    return [line.partition("=")[2] for line in (REPO / "packaging" / unit).read_text().splitlines()
            if line.startswith("Documentation=")]


def test_every_packaged_units_documentation_is_a_file_the_wheel_installs_in_the_units_venv(fresh_venv):
    """The project has no web address: each unit's Documentation= is the documentation the wheel installs as data
    files, under the prefix the unit runs the package from, and there in a wheel install."""
    for unit in PACKAGED_UNITS:
        assert documentation_of(unit), f"{unit} has no Documentation="
        for uri in documentation_of(unit):
            assert uri.startswith(f"file://{PACKAGED_PREFIX}/{INSTALLED_DOCS}/"), (unit, uri)
            assert (fresh_venv / uri.removeprefix(f"file://{PACKAGED_PREFIX}/")).is_file(), (unit, uri)
    for service in ("vllm-xpu-exporter.service", "vllm-xpu-gate.service"):
        assert f"ExecStart={PACKAGED_PREFIX}/bin/" in (REPO / "packaging" / service).read_text()


def test_the_long_descriptions_links_stay_relative_while_the_project_has_no_address_and_resolve_installed(
        fresh_venv):
    """The README is the wheel's long description; its links are relative. Made absolute they would need the
    project's address, which pyproject.toml does not give ([project.urls]), and an invented one would not open.
    So they stay relative, and resolve in the documentation the wheel installs beside the README. When the project
    gets an address, this fails until the long description's links are made absolute with it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    readme = fresh_venv / INSTALLED_DOCS / "README.md"
    targets = [target.partition("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme.read_text())
               if not re.match(r"[a-z]+:", target)]
    assert "urls" not in project, "the project has an address: make the long description's links absolute"
    assert targets, "the README links to nothing"
    assert [target for target in targets if target and not (readme.parent / target).is_file()] == []


def test_every_shipped_file_is_a_link_to_the_repositorys_own():
    """exporter/files/ holds no copy that could drift from rules/, grafana/ or packaging/."""
    from vllm_xpu_exporter.shipped import SHIPPED
    files = REPO / "exporter" / "files"
    assert {path.name for path in files.iterdir()} == {file_name for file_name, _ in SHIPPED.values()}
    for path in files.iterdir():
        assert path.is_symlink() and path.resolve().parent.name in ("rules", "grafana", "packaging"), path


def test_the_wheel_says_what_it_is_for_in_classifiers_and_keywords(installed):
    (dist_info,) = installed.glob("vllm_xpu_exporter-*.dist-info")
    metadata = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())
    classifiers = metadata.get_all("Classifier") or []
    assert "Topic :: System :: Monitoring" in classifiers and "Operating System :: POSIX :: Linux" in classifiers
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"Programming Language :: Python :: {requires.removeprefix('>=')}" in classifiers
    assert {"prometheus", "exporter", "vllm", "gpu"} <= set(metadata["Keywords"].split(","))


def test_the_sdist_carries_every_file_of_the_clone_its_tests_read(tmp_path):
    """An unpacked sdist holds the clone's files (docs, rules, deploy, packaging, the tests' fixtures...), so
    its tests find what they read; nothing but the build's own metadata beside them."""
    source = tracked_tree(tmp_path / "source")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path / "dist"), str(source)],
                   check=True, capture_output=True, timeout=600)
    (sdist,) = (tmp_path / "dist").glob("vllm_xpu_exporter-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {member.name.partition("/")[2] for member in archive.getmembers() if not member.isdir()}
    tracked = {str(path.relative_to(source)) for path in source.rglob("*") if not path.is_dir()}
    assert tracked - members == set()
    assert {name for name in members - tracked if not name.startswith("vllm_xpu_exporter.egg-info/")} \
        == {"PKG-INFO", "setup.cfg"}


def build_stage_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY of the Dockerfile's build stage, the files the package is built from."""
    lines = (REPO / "Dockerfile").read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("FROM ") and line.endswith(" AS build"))
    end = next(index for index in range(start + 1, len(lines)) if lines[index].startswith("FROM "))
    return [(words[1:-1], words[-1]) for words in (line.split() for line in lines[start:end])
            if words and words[0] == "COPY" and not any(word.startswith("--") for word in words)]


def test_the_image_builds_the_package_from_what_its_build_stage_copies(tmp_path):
    """The image copies some of the clone's files, not all: pip builds the package from those alone, the
    documentation it installs as data files included (a file the build needs and the stage leaves out fails the
    image's build)."""
    context = tmp_path / "src"
    context.mkdir()
    for sources, destination in build_stage_copies():
        for source in sources:
            target = context / destination / Path(source).name if destination.endswith("/") else context / destination
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / source, target)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(context)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("vllm_xpu_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert any(name.endswith(f"data/{INSTALLED_DOCS}/README.md") for name in archive.namelist())
