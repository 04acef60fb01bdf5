"""vllm_xpu_exporter.planner.execstart: a unit's ExecStart= read with systemd's rules, and the planner's edit of its
top-level words; the commands a drop-in cannot fix are refused. systemd's own reading is the oracle where
this machine has it: systemd-analyze verify loads what the edit produced."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_xpu_exporter.planner import execstart
from vllm_xpu_exporter.planner.execstart import NotEditable, exec_start_from_cat, planned_command

FLAGS = ("--gpu-memory-utilization", "0.7373", "--kv-cache-memory-bytes", "3378473421")
PLANNED = " ".join(FLAGS)


@pytest.mark.fast
def test_resets_continuations_and_two_commands() -> None:
    text = ("# /etc/systemd/system/u.service\n[Service]\nExecStart=/bin/old --a\n"
            "# /etc/systemd/system/u.service.d/x.conf\n[Service]\nExecStart=\nExecStart=/bin/new \\\n  --b 1\n")
    assert exec_start_from_cat(text).split() == ["/bin/new", "--b", "1"]
    assert exec_start_from_cat("[Service]\nExecStart=/a\nExecStart=/b\n") is None  # two commands: not ours to edit


@pytest.mark.fast
def test_a_comment_line_inside_a_continuation_is_skipped_not_an_end_nor_a_word() -> None:
    """The issue's breakage: a commented-out line between continued lines truncated the command (losing
    --max-model-len) or came back into it."""
    text = ("[Service]\nExecStart=/usr/bin/vllm serve google/gemma-3-4b-it \\\n"
            "    --gpu-memory-utilization 0.75 \\\n"
            "#   --enforce-eager \\\n"
            "    ; --quantization fp8 \\\n"
            "    --max-model-len 131072 --max-num-seqs 3\n")
    command = exec_start_from_cat(text)
    assert command.split() == ["/usr/bin/vllm", "serve", "google/gemma-3-4b-it", "--gpu-memory-utilization", "0.75",
                               "--max-model-len", "131072", "--max-num-seqs", "3"]
    assert planned_command(command, FLAGS).split() == [
        "/usr/bin/vllm", "serve", "google/gemma-3-4b-it", "--max-model-len", "131072", "--max-num-seqs", "3", *FLAGS]


@pytest.mark.fast
def test_an_empty_line_ends_a_continuation_and_other_sections_are_not_read() -> None:
    text = "[Unit]\nExecStart=/not/a/service/setting\n[Service]\nExecStart=/usr/bin/vllm serve m \\\n\nFoo=1\n"
    assert exec_start_from_cat(text).split() == ["/usr/bin/vllm", "serve", "m"]


@pytest.mark.fast
def test_quoting_specifiers_and_prefixes_are_kept_as_written() -> None:
    command = ("-/usr/bin/vllm serve \"/srv/models/my model\" --served-model-name 'chat %i' --name %n "
               "--gpu_memory_utilization=0.75 --kv-cache-memory-bytes \"5\" --chat-template \"a\\\"b\"")
    assert planned_command(command, FLAGS) == (
        "-/usr/bin/vllm serve \"/srv/models/my model\" --served-model-name 'chat %i' --name %n "
        f"--chat-template \"a\\\"b\" {PLANNED}")
    words = execstart.split_words(command).words
    assert words[2] == "/srv/models/my model" and words[4] == "chat %i"


@pytest.mark.fast
@pytest.mark.parametrize("command", [
    # the issue's: the flag inside the string was stripped and the pair appended outside it
    '/bin/sh -c "exec vllm serve m --gpu-memory-utilization 0.75 --max-model-len 4096"',
    # with the flag last, the closing quote was eaten
    "/bin/bash -c 'exec vllm serve m --max-model-len 4096 --gpu-memory-utilization 0.75'",
    "/usr/bin/python3 -c \"import runpy; runpy.run_module('vllm.entrypoints.cli.main')\" serve m",
    "/usr/bin/env sh -c 'vllm serve m --gpu-memory-utilization 0.75'",
])
def test_an_interpreter_c_string_is_refused_with_a_remedy(command: str) -> None:
    with pytest.raises(NotEditable, match=r"-c .*by hand, or run `vllm serve \.\.\.` directly"):
        planned_command(command, FLAGS)


@pytest.mark.fast
@pytest.mark.parametrize("command", [
    "/nix/store/abc-unit-script-vllm-chat-start/bin/vllm-chat-start",  # NixOS `script =`
    "/usr/local/bin/start-chat.sh",
])
def test_a_wrapper_script_is_refused_with_a_remedy(command: str) -> None:
    with pytest.raises(NotEditable, match="wrapper script"):
        planned_command(command, FLAGS)


@pytest.mark.fast
@pytest.mark.parametrize("command", [
    "/usr/bin/vllm serve m --gpu-memory-utilization 0.75",
    "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m",
    "/usr/bin/python3 /opt/launch.py --name %n --max-model-len 4096",  # a launcher given vLLM's flags
    "/usr/bin/env VLLM_LOGGING_LEVEL=INFO vllm serve m",
])
def test_commands_that_run_vllm_themselves_are_edited(command: str) -> None:
    assert planned_command(command, FLAGS).endswith(PLANNED)


@pytest.mark.fast
@pytest.mark.parametrize("command", ['/usr/bin/vllm serve "m', "/usr/bin/vllm serve m \\"])
def test_a_command_systemd_would_not_split_is_refused(command: str) -> None:
    with pytest.raises(NotEditable):
        planned_command(command, FLAGS)


ANALYZE = shutil.which("systemd-analyze", path="/usr/bin:/bin") or "systemd-analyze is not installed"


def test_systemd_loads_the_edited_command_as_the_same_words(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the edited command of a continued, commented, quoted ExecStart="""
    vllm = tmp_path / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    unit_text = (f"[Service]\nExecStart={vllm} serve \"my model\" \\\n#  --enforce-eager \\\n"
                 "  --gpu-memory-utilization 0.75 --name %n\n")
    edited = planned_command(exec_start_from_cat(unit_text), FLAGS)
    unit = tmp_path / "vllm-x.service"
    unit.write_text(f"{unit_text}[Service]\nExecStart=\nExecStart={edited}\n")
    result = subprocess.run([ANALYZE, "verify", "--man=no", "--recursive-errors=no", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "SYSTEMD_LOG_LEVEL": "info"})
    assert result.returncode == 0, result.stderr
