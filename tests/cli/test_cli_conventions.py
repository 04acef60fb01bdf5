"""The command lines alike (vllm-xpu-exporter and its selfcheck, vllm-xpu-gate serve and wait, vllm-xpu-plan):
every flag explained, every default shown in --help as the exporter shows it, the same logging flags where a
command logs."""

from __future__ import annotations

import argparse

import pytest

from vllm_xpu_exporter.cli import build_parser as exporter_parser
from vllm_xpu_exporter.gate.cli import build_serve_parser, build_wait_parser
from vllm_xpu_exporter.planner.cli import build_parser as plan_parser
from vllm_xpu_exporter.selfcheck import build_parser as selfcheck_parser

pytestmark = pytest.mark.fast

PARSERS = {"vllm-xpu-exporter": exporter_parser, "vllm-xpu-gate serve": build_serve_parser,
           "vllm-xpu-gate wait": build_wait_parser, "vllm-xpu-plan": plan_parser,
           "vllm-xpu-exporter selfcheck": selfcheck_parser}


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions
            if action.option_strings and action.default is not argparse.SUPPRESS]


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_is_explained_and_every_default_shown(name: str) -> None:
    parser = PARSERS[name]()
    text = "".join(parser.format_help().split())  # wrapped lines break at spaces and hyphens
    for action in flags(parser):
        help_text = " ".join((action.help or "").split())
        assert help_text, f"{name}: {action.option_strings[0]} has no help"
        if action.default not in (None, [], (), "", False):
            shown = "".join(parser._get_formatter()._expand_help(action).split())
            assert "default" in shown and shown in text, f"{name}: {action.option_strings[0]}: {shown!r}"
    assert "(default:None)" not in text and "(default:[])" not in text


@pytest.mark.parametrize("name", ["vllm-xpu-exporter", "vllm-xpu-gate serve", "vllm-xpu-exporter selfcheck"])
def test_the_commands_that_log_take_the_same_logging_flags(name: str) -> None:
    args = PARSERS[name]().parse_args(["--log.level", "debug", "--log.format", "json"])
    assert (args.log_level, args.log_format) == ("debug", "json")
    with pytest.raises(SystemExit):
        PARSERS[name]().parse_args(["--log.format", "text"])
