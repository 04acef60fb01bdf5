"""A vLLM unit's command as systemd reads it, and the planner's edit of it. Pure: text in, text out.

systemd's unit-file syntax (systemd.syntax(7), read in systemd's config parser): a line ending in a backslash
continues on the next, the backslash becoming a space; lines whose first non-blank character is `#` or `;`
are comments and are skipped, also between continued lines (they neither end nor join the command); an empty
line ends a continuation. `ExecStart=` with no value resets the list; a unit with several commands is not
ours to edit. The command's words are split as systemd splits them: blanks separate words, `"..."` and
`'...'` quote (anywhere in a word), a backslash escapes the next character; specifiers (`%i`) and `$VAR`
stay as written. The first word may carry the prefixes `@ - : + !`.

The planner edits only top-level words of a command that runs `vllm serve` (or `python -m
vllm.entrypoints...`, or a launcher given vLLM's flags among its words) itself: a shell or interpreter
`-c` string, or a wrapper script, holds vLLM's flags where no edit of the unit's words can reach them; such commands are refused with what to do instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["Command", "NotEditable", "exec_start_from_cat", "planned_command", "split_words"]

_COMMENT = ("#", ";")
_PREFIX_CHARS = "@-:+!"
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"}
_INTERPRETER = re.compile(r"(?:python[0-9.]*|perl|ruby|node)")
_FLAGS = {"gpu_memory_utilization", "kv_cache_memory_bytes"}
_ENGINE_FLAGS = {"--gpu-memory-utilization", "--kv-cache-memory-bytes", "--max-model-len", "--max-num-seqs"}


class NotEditable(ValueError):
    """The command cannot be edited safely; the message says why and what to do."""


@dataclass(frozen=True)
class Command:
    """One ExecStart= command: the value as written (continuations joined) and its words."""

    text: str
    raw_words: tuple[str, ...]  # each word as written (quotes and escapes kept)
    words: tuple[str, ...]  # each word as the process sees it (quotes removed, escapes resolved)


def exec_start_from_cat(text: str) -> str | None:
    """The unit's effective ExecStart= value from `systemctl cat UNIT` (the unit file and its drop-ins, in
    order), continuations joined with systemd's rules. None unless there is exactly one command."""
    commands: list[str] = []
    section = ""
    pending: str | None = None
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped and stripped[0] in _COMMENT:
            continue  # a comment, also between continued lines
        if pending is not None:
            pending += " " + stripped
        elif stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
            continue
        elif section == "[Service]" and re.match(r"ExecStart\s*=", stripped):
            pending = stripped.split("=", 1)[1]
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        value, pending = pending.strip(), None
        if value:
            commands.append(value)
        else:
            commands.clear()
    if pending is not None and pending.strip():
        commands.append(pending.strip())
    return commands[0] if len(commands) == 1 else None


def split_words(text: str) -> Command:
    """The command's words as systemd splits them, each as written and as unquoted."""
    raw_words: list[str] = []
    words: list[str] = []
    index, length = 0, len(text)
    while index < length:
        while index < length and text[index] in " \t\n":
            index += 1
        if index >= length:
            break
        begin, value, quote = index, [], None
        while index < length:
            char = text[index]
            if quote is None and char in " \t\n":
                break
            if char == "\\":
                if index + 1 >= length:
                    raise NotEditable("its ExecStart= ends in a lone backslash")
                value.append(text[index + 1])
                index += 2
                continue
            if quote is None and char in "\"'":
                quote = char
            elif char == quote:
                quote = None
            else:
                value.append(char)
            index += 1
        if quote is not None:
            raise NotEditable("its ExecStart= has an unterminated quote")
        raw_words.append(text[begin:index])
        words.append("".join(value))
    return Command(text, tuple(raw_words), tuple(words))


def _flag_name(word: str) -> tuple[str | None, bool]:
    """The planner's flag a word is (normalised to underscores) and whether it carries its value (`=`)."""
    if not word.startswith("--"):
        return None, False
    name, has_value = word[2:].partition("=")[0].replace("-", "_"), "=" in word
    return (name, has_value) if name in _FLAGS else (None, False)


def _runs_vllm(words: tuple[str, ...]) -> bool:
    """`vllm serve`, `python -m vllm.entrypoints...`, or a program given vLLM's engine flags among its own
    words (a launcher that passes them on); a command with none of these is a wrapper whose vLLM flags are
    out of reach."""
    for index, word in enumerate(words):
        if os.path.basename(word) == "vllm" and index + 1 < len(words) and words[index + 1] == "serve":
            return True
        if word == "-m" and index + 1 < len(words) and words[index + 1].startswith("vllm.entrypoints"):
            return True
    return any(word.partition("=")[0].replace("_", "-") in _ENGINE_FLAGS for word in words[1:])


def _program(words: tuple[str, ...]) -> str:
    """The program the command runs: the first word without systemd's prefixes, or what `env` runs."""
    names = [os.path.basename(word) for word in (words[0].lstrip(_PREFIX_CHARS), *words[1:])]
    if names[0] != "env":
        return names[0]
    rest = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
    return os.path.basename(rest[0]) if rest else "env"


def check_editable(command: Command, what: str = "its ExecStart=") -> None:
    """Raise NotEditable unless the planner's flags can be set among the command's top-level words (`what`
    names the command in the message: a unit's ExecStart=, a container's command)."""
    words = command.words
    if not words:
        raise NotEditable(f"{what} is empty")
    program = _program(words)
    if ";" in words:
        raise NotEditable(f"{what} holds several commands (';')")
    interpreter = program in _SHELLS or _INTERPRETER.fullmatch(program)
    if interpreter and "-c" in words:
        raise NotEditable(f"{what} runs vLLM through `{program} -c \"...\"`, whose string holds vLLM's "
                          f"flags where no edit of its words can reach them: put --gpu-memory-utilization and "
                          f"--kv-cache-memory-bytes in that string by hand, or run `vllm serve ...` directly")
    if not _runs_vllm(words):
        raise NotEditable(f"{what} runs {words[0]!r}, not `vllm serve`, with none of vLLM's flags (a "
                          f"wrapper script?): set "
                          f"--gpu-memory-utilization and --kv-cache-memory-bytes where it calls vLLM (on NixOS: "
                          f"the values of --format nixos, in the module's options or extra arguments)")


def planned_command(text: str, flags: tuple[str, ...]) -> str:
    """The command with its own --gpu-memory-utilization / --kv-cache-memory-bytes words (both spellings,
    `--flag value` and `--flag=value`) dropped and `flags` appended; every other word kept as written."""
    command = split_words(text)
    check_editable(command)
    return " ".join([*_without_planned_flags(command.raw_words, command.words), *flags])


def planned_words(words: tuple[str, ...], flags: tuple[str, ...], what: str,
                  checked: bool = False) -> tuple[str, ...]:
    """A command given as its words (a container's, `what`), with the planner's flags dropped and `flags`
    appended. Raises NotEditable as `planned_command` does (`checked`: the caller checked a command these words
    end, such as an entrypoint's followed by them)."""
    if not checked:
        check_editable(Command(" ".join(words), words, words), what)
    return (*_without_planned_flags(words, words), *flags)


def _without_planned_flags(raw_words: tuple[str, ...], words: tuple[str, ...]) -> list[str]:
    kept: list[str] = []
    skip_value = False
    for raw, word in zip(raw_words, words):
        if skip_value:
            skip_value = False
            continue
        name, has_value = _flag_name(word)
        if name is not None:
            skip_value = not has_value
            continue
        kept.append(raw)
    return kept
