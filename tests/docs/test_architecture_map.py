"""docs/development/architecture.md matches the tree: its list of modules ("The tree") is `exporter/`'s, its map of
modules to test files ("Modules and their tests") has a row for every module, names only test files that
exist, and says truly which of them import the module ("imported by") and which do not ("run by"); and every
test file sits in the folder its name's row of the folders' table names."""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "development" / "architecture.md"
TESTS = REPO / "tests"
NO_TESTS = "—"


def module_paths() -> set[str]:
    return {str(path.relative_to(REPO)) for path in (REPO / "exporter").rglob("*.py")}


def dotted(path: str) -> str:
    """The import name of a file below exporter/, the source folder of the package vllm_xpu_exporter."""
    parts = ("vllm_xpu_exporter", *Path(path).relative_to("exporter").with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str) -> Path | None:
    package, *rest = name.split(".")
    if package != "vllm_xpu_exporter":
        return None
    base = REPO.joinpath("exporter", *rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def reexported_from(package: str, name: str) -> str | None:
    """The module a package's `__init__.py` imports `name` from, if it does."""
    init = module_file(package)
    if init is None or init.name != "__init__.py":
        return None
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and any((alias.asname or alias.name) == name for alias in node.names):
            return node.module
    return None


@functools.cache
def imported_modules(test_file: Path) -> frozenset[str]:
    """The exporter modules a file imports anywhere (module level, functions, TYPE_CHECKING): `import a.b`,
    `from a import b` (the submodule b if there is one, else a, and the module a re-exports b from)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "vllm_xpu_exporter")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "vllm_xpu_exporter":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if module_file(submodule) is not None:
                    found.add(submodule)
                    continue
                found.add(node.module)
                source = reexported_from(node.module, alias.name)
                if source is not None:
                    found.add(source)
    return frozenset(found)


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def tree_listing() -> list[str]:
    block = section("The tree").split("```")[1]
    return re.findall(r"^(exporter/\S+\.py)\s", block, re.MULTILINE)


def files_in(cell: str) -> list[str]:
    cell = cell.strip()
    if cell == NO_TESTS:
        return []
    names = [name.strip() for name in cell.split(",")]
    assert all(re.fullmatch(r"`\w+/test_\w+\.py`", name) for name in names), \
        f"not a list of test files, each as its folder below tests/ and its name: {cell!r}"
    return [name.strip("`") for name in names]


def map_rows() -> dict[str, tuple[list[str], list[str]]]:
    rows: dict[str, tuple[list[str], list[str]]] = {}
    for line in section("Modules and their tests").splitlines():
        match = re.fullmatch(r"\| `(exporter/[^`]+\.py)` \|(.*)\|(.*)\|", line.strip())
        if match:
            assert match[1] not in rows, f"{match[1]} has two rows"
            rows[match[1]] = (files_in(match[2]), files_in(match[3]))
    return rows


def folder_rules() -> list[tuple[str, list[str]]]:
    """The folders' table of "Modules and their tests": each folder of tests/ and the test-file names that go there."""
    rules = []
    for line in section("Modules and their tests").splitlines():
        match = re.fullmatch(r"\| `(\w+)/` \| (.*) \|", line.strip())
        if match:
            rules.append((match[1], re.findall(r"`(test_[\w*]+\.py)`", match[2])))
    return rules


def folder_for(name: str, rules: list[tuple[str, list[str]]]) -> str | None:
    """The folder of a test file's name: the first row with a pattern that matches it."""
    return next((folder for folder, patterns in rules if any(fnmatch.fnmatchcase(name, p) for p in patterns)), None)


def holds_no_code(path: str) -> bool:
    body = ast.parse((REPO / path).read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def test_the_tree_lists_every_module_of_exporter_once_and_nothing_else():
    listed = tree_listing()
    assert len(listed) == len(set(listed)), "a module is listed twice in 'The tree'"
    missing, gone = sorted(module_paths() - set(listed)), sorted(set(listed) - module_paths())
    assert not missing, f"add them to docs/development/architecture.md, 'The tree': {missing}"
    assert not gone, f"'The tree' of docs/development/architecture.md lists modules that do not exist: {gone}"


def test_the_map_has_a_row_for_every_module_and_none_for_a_module_that_is_gone():
    rows = map_rows()
    missing, gone = sorted(module_paths() - set(rows)), sorted(set(rows) - module_paths())
    assert not missing, f"add a row for each to docs/development/architecture.md's map, 'Modules and their tests': {missing}"
    assert not gone, f"docs/development/architecture.md's map has rows for modules that do not exist: {gone}"


def test_every_file_the_map_names_exists_and_imports_the_module_or_runs_it_without_importing_it():
    problems = []
    for path, (imported_by, run_by) in map_rows().items():
        module = dotted(path)
        for name in imported_by + run_by:
            if not (TESTS / name).is_file():
                found = [str(other.relative_to(TESTS)) for other in TESTS.glob(f"*/{Path(name).name}")]
                problems.append(f"{path}: tests/{name} does not exist" + (f" (it is tests/{found[0]})" if found else ""))
        for name in imported_by:
            if (TESTS / name).is_file() and module not in imported_modules(TESTS / name):
                problems.append(f"{path}: tests/{name} does not import {module} (imported by)")
        for name in run_by:
            if (TESTS / name).is_file() and module in imported_modules(TESTS / name):
                problems.append(f"{path}: tests/{name} imports {module}: it belongs under 'imported by'")
        if not imported_by and not run_by and not holds_no_code(path):
            problems.append(f"{path}: no test file named, though it holds code")
    assert not problems, "\n".join(problems)


def test_every_test_file_sits_in_the_folder_its_name_says_and_none_at_the_top_of_tests():
    rules = folder_rules()
    assert rules, "no folders' table in 'Modules and their tests'"
    misplaced = [f"tests/{path.relative_to(TESTS)}: " + (f"belongs in tests/{folder}/" if (folder := folder_for(path.name, rules))
                                                       else "no row matches its name")
                 for path in sorted(TESTS.rglob("test_*.py"))
                 if "node_modules" not in path.parts and "fixtures" not in path.parts
                 and path.parent.relative_to(TESTS).as_posix() != folder_for(path.name, rules)]
    assert not misplaced, "move each test file to its folder (docs/development/architecture.md, 'Modules and their " \
        "tests'), or add a row for its name there:\n" + "\n".join(misplaced)


def test_a_test_file_takes_the_first_folder_whose_row_matches_its_name():
    rules = [("real_systemd", ["test_*_real_systemd.py"]), ("gate", ["test_gate.py", "test_gate_*.py"])]
    assert folder_for("test_gate_real_systemd.py", rules) == "real_systemd"
    assert folder_for("test_gate_lines.py", rules) == "gate"
    assert folder_for("test_other.py", rules) is None


def test_the_import_reading_follows_submodules_and_reexports(tmp_path):
    test_file = tmp_path / "test_example.py"
    test_file.write_text("from vllm_xpu_exporter.sources import dmem\n"
                         "from vllm_xpu_exporter.sources.journal import JournalReader\n"
                         "def f():\n    import vllm_xpu_exporter.gate.lines\n"
                         "from vllm_xpu_exporter import __version__\n")
    assert imported_modules(test_file) == {"vllm_xpu_exporter.sources.dmem", "vllm_xpu_exporter.sources.journal",
                                           "vllm_xpu_exporter.sources.journal.reader", "vllm_xpu_exporter.gate.lines", "vllm_xpu_exporter"}


def ownership_table() -> list[str]:
    """The first column of "Who owns what": the modules, packages (`http/`) and globs (`collectors/*.py`)
    each row is about."""
    section = DOC.read_text().split("## Who owns what", 1)[1].split("\n## ", 1)[0]
    return [cell for row in re.findall(r"^\| ([^|]+) \|", section, re.M) for cell in re.findall(r"`([^`]+)`", row)]


def test_every_module_has_an_owner_row():
    """Every module of exporter/ (but a package's __init__ and __main__) is in "Who owns what": by its path,
    its package's row or a glob row."""
    owned = ownership_table()
    unowned = sorted(
        path for path in (str(Path(module).relative_to("exporter")) for module in module_paths())
        if Path(path).name not in ("__init__.py", "__main__.py")
        and not any(path == entry or (entry.endswith("/") and path.startswith(entry)) or fnmatch.fnmatch(path, entry)
                    for entry in owned))
    assert not unowned, f"add them to docs/development/architecture.md, 'Who owns what': {unowned}"
