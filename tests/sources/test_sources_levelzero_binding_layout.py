"""The ctypes mirror in vllm_xpu_exporter.sources.levelzero.binding matches the installed Level Zero headers.

A C program, generated from the module's Structures and ZE_/ZES_ constants, is compiled
against /usr/include/level_zero (libze-dev) and prints sizeof, every field's offsetof and
size, and every constant's value. Any drift between the two sides fails a test.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest

from fakeze import FAKE_DRIVER_SOURCE
from vllm_xpu_exporter.sources.levelzero import binding as levelzero

CONSTANT_NAME = re.compile(r"^ZES?_[A-Z0-9_]+$")


def module_constants() -> dict[str, int]:
    return {
        name: value
        for name, value in vars(levelzero).items()
        if CONSTANT_NAME.match(name) and isinstance(value, int) and not isinstance(value, bool)
    }


def layout_probe_source() -> str:
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        "#include <level_zero/zes_api.h>",
        "#include <level_zero/loader/ze_loader.h>",
        '#include "ze_usablemem.h"',  # the usable-memory extension, for headers older than spec 1.15
        "#define FIELD(T, f) printf(\"field %s %s %zu %zu\\n\", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))",
        "int main(void) {",
    ]
    for structure in levelzero.STRUCTURES:
        c_type = structure.__name__
        lines.append(f'    printf("sizeof %s %zu\\n", "{c_type}", sizeof({c_type}));')
        lines += [f"    FIELD({c_type}, {name});" for name, *_ in structure._fields_]
    for name in module_constants():
        lines.append(f'    printf("constant %s %lld\\n", "{name}", (long long)({name}));')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def header_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], int | tuple[int, int]]:
    """What the C compiler says: ('sizeof', T), ('field', T, f) -> (offset, size), ('constant', N)."""
    directory: Path = tmp_path_factory.mktemp("levelzero_layout")
    source = directory / "probe.c"
    source.write_text(layout_probe_source())
    program = directory / "probe"
    compiled = subprocess.run(
        ["gcc", "-Wall", "-Werror", "-I", str(FAKE_DRIVER_SOURCE.parent), "-o", str(program), str(source)],
        capture_output=True, text=True, check=False
    )
    assert compiled.returncode == 0, f"the layout probe does not compile against the headers:\n{compiled.stderr}"
    output = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    layout: dict[tuple[str, ...], int | tuple[int, int]] = {}
    for line in output.splitlines():
        kind, *words = line.split()
        if kind == "field":
            layout[(kind, words[0], words[1])] = (int(words[2]), int(words[3]))
        else:
            layout[(kind, words[0])] = int(words[1])
    return layout


@pytest.mark.parametrize("structure", levelzero.STRUCTURES, ids=lambda structure: structure.__name__)
def test_structure_size_and_every_field_offset_match_the_header(
    structure: type[ctypes.Structure], header_layout: dict[tuple[str, ...], int | tuple[int, int]]
) -> None:
    c_type = structure.__name__
    python_side = {("sizeof", c_type): ctypes.sizeof(structure)}
    header_side = {("sizeof", c_type): header_layout[("sizeof", c_type)]}
    for name, *_ in structure._fields_:
        descriptor = getattr(structure, name)
        python_side[("field", c_type, name)] = (descriptor.offset, descriptor.size)
        header_side[("field", c_type, name)] = header_layout[("field", c_type, name)]
    assert python_side == header_side


def test_every_constant_matches_the_header(header_layout: dict[tuple[str, ...], int | tuple[int, int]]) -> None:
    constants = module_constants()
    assert len(constants) > 50, "the constant scan found too few ZE_/ZES_ names"
    assert constants == {name: header_layout[("constant", name)] for name in constants}


def test_every_structure_of_the_module_is_checked() -> None:
    defined = {
        value
        for value in vars(levelzero).values()
        if isinstance(value, type) and issubclass(value, ctypes.Structure) and value.__module__ == levelzero.__name__
    }
    assert defined == set(levelzero.STRUCTURES)


def test_sizes_recorded_in_the_reference_notes_hold() -> None:
    # Independent of the compiler run: the sizes the loader's headers give on x86-64, measured once with a C
    # compiler and written here, so a changed ctypes layout shows even where no compiler runs.
    expected = {
        levelzero.ze_device_properties_t: 368,
        levelzero.zes_device_properties_t: 776,
        levelzero.zes_pci_properties_t: 56,
        levelzero.zes_mem_properties_t: 48,
        levelzero.zes_mem_state_t: 40,
        levelzero.zes_process_state_t: 48,
    }
    assert {structure: ctypes.sizeof(structure) for structure in expected} == expected
