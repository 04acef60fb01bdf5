"""Logging in the Prometheus exporters' style: logfmt or JSON lines on stderr."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
import traceback

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
FORMATS = ("logfmt", "json")
DEFAULT_LEVEL = "info"
DEFAULT_FORMAT = "logfmt"

_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
                logging.CRITICAL: "error"}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, str]:
    fields = {
        "ts": _timestamp(record),
        "level": _LEVEL_NAMES.get(record.levelno, "info"),
        "source": record.name.removeprefix("vllm_xpu_exporter."),
        "msg": record.getMessage(),
    }
    if record.exc_info and record.exc_info[1] is not None:
        fields["err"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            # Safe to log: a traceback shows code (file, line, function, the source line), never the values
            # of variables, so no password, key or hash from a config file reaches the log through it.
            fields["stack"] = "".join(traceback.format_tb(record.exc_info[2])).rstrip("\n")
    return fields


# As Go's go-logfmt escapes values (the Prometheus exporters log with it): a value with a space, '=', '"', a
# backslash or a control character is quoted, and in it backslash, quote, newline, carriage return and
# tab are escaped as \\ \" \n \r \t, any other control character as \u00XX, so that no byte of a request
# line reaches a terminal or a log parser raw. DEL and the C1 controls are escaped too (Go leaves them).
_NEEDS_QUOTES = re.compile(r'[\x00-\x20="\\\x7f-\x9f\u2028\u2029]')
_ESCAPED = re.compile(r'[\x00-\x1f"\\\x7f-\x9f\u2028\u2029]')
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    return _SHORT_ESCAPES.get(character) or f"\\u{ord(character):04x}"


def _logfmt_value(value: str) -> str:
    if value and not _NEEDS_QUOTES.search(value):
        return value
    return '"' + _ESCAPED.sub(_escape, value) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), ensure_ascii=False)


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """--log.level and --log.format (dests log_level, log_format), as the exporter and the gate service take them."""
    logging_group = parser.add_argument_group("logging")
    logging_group.add_argument("--log.level", dest="log_level", choices=tuple(LEVELS), default=DEFAULT_LEVEL,
                               help="log only messages at this level or above, to standard error")
    logging_group.add_argument("--log.format", dest="log_format", choices=FORMATS, default=DEFAULT_FORMAT,
                               help="logfmt (key=value, as the Prometheus exporters log) or json, one object a line")


def setup_logging(level: str = DEFAULT_LEVEL, fmt: str = DEFAULT_FORMAT) -> None:
    """Route the package's logs to stderr, one line per record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
