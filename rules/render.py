#!/usr/bin/env python3
"""Render the bundled Prometheus rules with your thresholds, durations, severities and selectors.

    python3 rules/render.py                                  # the defaults: rules/vllm-xpu-exporter.yaml
    python3 rules/render.py --set selector='job="gpu"' --set memoryNearlyFullFor=30m > my-rules.yaml
    python3 rules/render.py --values my-values.yaml > my-rules.yaml

The rules are the monitoring mixin's (mixin/mixin.libsonnet): its template mixin/rules.yaml marks each
knob as ``${name}`` (``${name:seconds}`` a duration knob in seconds, ``${name%anchor}`` a pattern knob with
its ``%s`` as ``anchor``), mixin/config.libsonnet lists every knob with its default, and the mixin fills
them in; this script checks your values and evaluates the mixin with them (mixin/rules.jsonnet).
Values files hold a subset of those knobs; ``--set`` wins over ``--values``, later over earlier.
Needs Python 3, PyYAML and the jsonnet package (pip install jsonnet); usable from a shell as
``render(overrides)``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parent
MIXIN = RULES_DIR.parent / "mixin"
DEFAULTS = MIXIN / "config.libsonnet"
RENDERED = RULES_DIR / "vllm-xpu-exporter.yaml"

DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
SECONDS_PER_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
SEVERITIES = ("critical", "warning", "info")
# The `reason` values of xpu_frequency_throttled (docs/metrics.md).
THROTTLE_REASONS = ("average_power", "burst_power", "current", "thermal", "psu", "software_range", "hardware_range")
NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[+-]?\d+)?$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Where a link pattern may lead: Prometheus's own address, or an absolute http(s) URL with a host.
LINK_START = re.compile(r"^(?:\{\{ *\$externalURL *\}\}/|https?://[^/{}\s]+)")
# The knobs a release renamed: {old name: what to do instead}.
RENAMED = {"runbookUrl": "runbookURLPattern, with %s where the alert's anchor goes (runbookUrl=U is U#%s)"}


class RenderError(ValueError):
    """A knob that does not exist, or a value a knob cannot take."""


def evaluate(path: Path, **arguments: object) -> str:
    """The output of the mixin's jsonnet file at `path`, called with these top-level arguments."""
    try:
        import _jsonnet
    except ImportError:
        raise RenderError("the rules and dashboard are a jsonnet mixin: install the Python package jsonnet "
                          "(pip install jsonnet)") from None
    try:
        return _jsonnet.evaluate_file(str(path), jpathdir=[str(MIXIN)],
                                      tla_codes={name: json.dumps(value) for name, value in arguments.items()})
    except RuntimeError as error:
        raise RenderError(str(error).strip().splitlines()[0]) from None


def load_defaults() -> dict[str, str]:
    """The knobs and their default values (mixin/config.libsonnet), as text."""
    return json.loads(evaluate(MIXIN / "knobs.jsonnet"))


def load_values(path: Path) -> dict[str, str]:
    """A values file: a YAML mapping of knob names to values."""
    values = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(values, dict):
        raise RenderError(f"{path}: a values file is a mapping of knob names to values")
    return {str(name): _text(value) for name, value in values.items()}


def duration_seconds(duration: str) -> float:
    """A Prometheus duration ("1h30m") in seconds."""
    if not DURATION.match(duration):
        raise RenderError(f"not a Prometheus duration: {duration!r}")
    return sum(int(count) * SECONDS_PER_UNIT[unit] for count, unit in DURATION_PART.findall(duration))


def validate(name: str, value: str) -> None:
    """Refuse a value the knob cannot take (by the knob's name: *For/*Window, *Severity, *Ratio, *Bytes,
    *Celsius, *Reasons, *Label, *Pattern, *Selector, show*)."""
    if name.endswith(("For", "Window")):
        duration_seconds(value)
    elif name.endswith("Severity"):
        if value not in SEVERITIES:
            raise RenderError(f"{name}: severity must be one of {', '.join(SEVERITIES)}, got {value!r}")
    elif name.endswith("Ratio"):
        if not NUMBER.match(value) or not 0 <= float(value) <= 1:
            raise RenderError(f"{name}: a ratio is a number from 0 to 1, got {value!r}")
    elif name.endswith("Bytes"):
        if not NUMBER.match(value):
            raise RenderError(f"{name}: a number of bytes, got {value!r}")
    elif name.endswith("Celsius"):
        if not NUMBER.match(value):
            raise RenderError(f"{name}: a number of degrees Celsius, got {value!r}")
    elif name.endswith("Reasons"):
        unknown = [reason for reason in value.split("|") if reason not in THROTTLE_REASONS]
        if unknown:
            raise RenderError(f"{name}: throttle reasons joined by |, of {', '.join(THROTTLE_REASONS)}; "
                              f"not a throttle reason: {', '.join(map(repr, unknown))}")
    elif name.endswith("Label"):
        if not LABEL_NAME.match(value):
            raise RenderError(f"{name}: a Prometheus label name, e.g. cluster, got {value!r}")
    elif name.endswith("Pattern"):
        if value.count("%s") != 1:
            raise RenderError(f"{name}: a URL with one %s where the alert's anchor goes, got {value!r}")
        if "$labels" in value or not LINK_START.match(value):
            raise RenderError(f"{name}: starts with {{{{ $externalURL }}}}/ or http(s)://host, and takes nothing from "
                              f"the firing series' labels (a down or absent exporter serves no page), got {value!r}")
    elif name.startswith("show"):
        if value not in ("true", "false"):
            raise RenderError(f"{name}: true or false, got {value!r}")
    elif name.endswith("Selector") or name == "selector":
        if not value.strip() or "{" in value or "}" in value:
            raise RenderError(f"{name}: label matchers without braces, e.g. job=\"vllm-xpu-exporter\", got {value!r}")


def knob_values(overrides: Mapping[str, str] = (), defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """Defaults with the overrides applied and checked."""
    values = dict(load_defaults() if defaults is None else defaults)
    for name, value in dict(overrides).items():
        if name in RENAMED:
            raise RenderError(f"the knob {name!r} is now {RENAMED[name]}")
        if name not in values:
            raise RenderError(f"unknown knob {name!r}; the knobs are in {DEFAULTS}")
        values[name] = _text(value)
    for name, value in values.items():
        validate(name, value)
    return values


def render(overrides: Mapping[str, str] = ()) -> str:
    """The rules file text with the defaults and these overrides."""
    rendered = json.loads(evaluate(MIXIN / "rules.jsonnet", overrides=knob_values(overrides)))
    yaml.safe_load(rendered)  # a value that breaks the YAML fails here, not in Prometheus
    return rendered


def parse_assignments(assignments: Iterable[str]) -> dict[str, str]:
    """["name=value", ...] -> {name: value}."""
    values = {}
    for assignment in assignments:
        name, equals, value = assignment.partition("=")
        if not equals or not name:
            raise RenderError(f"--set takes name=value, got {assignment!r}")
        values[name.strip()] = value
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", action="append", default=[], type=Path,
                        help="YAML file of knob values (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="assignments",
                        help="one knob value (repeatable)")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
    parser.add_argument("--list", action="store_true", help="print the knobs and their defaults")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for name, value in load_defaults().items():
                print(f"{name}={value}")
            return 0
        overrides: dict[str, str] = {}
        for path in args.values:
            overrides.update(load_values(path))
        overrides.update(parse_assignments(args.assignments))
        text = render(overrides)
    except (RenderError, OSError, yaml.YAMLError) as error:
        print(f"render.py: {error}", file=sys.stderr)
        return 2
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
