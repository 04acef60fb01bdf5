"""The ctypes binding of libsystemd's sd-journal, and the one error the journal source raises.

:class:`LibSystemd` opens libsystemd and has one thin method per sd-journal entry point, named after
it. Every method checks the C result: a negative one (``-errno``) raises :class:`JournalError`, which
keeps the errno and the function's name. Handles are ``ctypes.c_void_p``::

    lib = LibSystemd()                                    # JournalError if libsystemd cannot be loaded
    handle = lib.sd_journal_open_directory("/var/log/journal", 0)
    while lib.sd_journal_next(handle):
        ...
    lib.sd_journal_close(handle)

The per-entry functions of a catch-up (``sd_journal_next``, ``sd_journal_get_data`` and the two
timestamps) are also there raw, as ``raw_*``: untyped and unchecked, they return the C int, and
their caller checks it (the reader's decoder does, for every call). ctypes' conversion of declared
arguments costs more than the C function (sd_journal_get_data: 2.0 µs with, 1.3 µs without), and a
checked method adds a Python call per field read. Callers of the raw functions pass exactly: the
handle (c_void_p), bytes, and byref() of c_void_p, c_size_t, c_uint64 or a 16-byte c_char array.

The API is documented in sd_journal_open(3), sd_journal_next(3), sd_journal_get_data(3),
sd_journal_add_match(3), sd_journal_query_unique(3), sd_journal_wait(3) and sd_journal_get_cursor(3).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence

LIBSYSTEMD = "libsystemd.so.0"

# sd_journal_open(3) flags.
SD_JOURNAL_LOCAL_ONLY = 1 << 0
SD_JOURNAL_RUNTIME_ONLY = 1 << 1
SD_JOURNAL_SYSTEM = 1 << 2
SD_JOURNAL_CURRENT_USER = 1 << 3

# sd_journal_process(3) / sd_journal_wait(3) results.
SD_JOURNAL_NOP = 0
SD_JOURNAL_APPEND = 1
SD_JOURNAL_INVALIDATE = 2


class JournalError(OSError):
    """The journal cannot be read now: an sd-journal call failed, or a check the reader makes before
    one did; retry later.

    ``errno`` is the error number (positive) and ``strerror`` its text; ``function`` names the C
    function that failed: an ``sd_journal_*`` function, ``dlopen`` when libsystemd cannot be loaded,
    or the system call of the reader's own checks (``stat``, ``access``, ``open``). ``str()`` is one
    line naming what and why.
    """

    def __init__(self, function: str, error_number: int, *, doing: str | None = None,
                 message: str | None = None) -> None:
        super().__init__(error_number, os.strerror(error_number))
        self.function = function
        self.message = message or f"{doing or function} failed: {self.strerror}"

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of_result(cls, function: str, result: int, doing: str) -> JournalError:
        """The error of a negative result (``-errno``) of ``function``."""
        return cls(function, -result, doing=doing)


class LibSystemd:
    """The sd-journal entry points of libsystemd, with their C signatures; see the module docstring."""

    def __init__(self, library: str = LIBSYSTEMD) -> None:
        try:
            lib = ctypes.CDLL(library, use_errno=True)
        except OSError as error:
            raise JournalError("dlopen", errno.ELIBACC, message=f"cannot load {library}: {error}") from None
        handle_p = ctypes.c_void_p
        handle_pp = ctypes.POINTER(ctypes.c_void_p)
        data_pp = ctypes.POINTER(ctypes.c_void_p)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        c_int, c_char_p, c_size_t, c_uint64 = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64

        def bind(name: str, restype: type | None, *argtypes: type) -> Callable[..., int]:
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
            return function

        self._open = bind("sd_journal_open", c_int, handle_pp, c_int)
        self._open_directory = bind("sd_journal_open_directory", c_int, handle_pp, c_char_p, c_int)
        self._open_files = bind("sd_journal_open_files", c_int, handle_pp, ctypes.POINTER(c_char_p), c_int)
        self._close = bind("sd_journal_close", None, handle_p)
        self._set_data_threshold = bind("sd_journal_set_data_threshold", c_int, handle_p, c_size_t)
        self._add_match = bind("sd_journal_add_match", c_int, handle_p, c_char_p, c_size_t)
        self._add_disjunction = bind("sd_journal_add_disjunction", c_int, handle_p)
        self._add_conjunction = bind("sd_journal_add_conjunction", c_int, handle_p)
        self._flush_matches = bind("sd_journal_flush_matches", None, handle_p)
        self._seek_head = bind("sd_journal_seek_head", c_int, handle_p)
        self._seek_tail = bind("sd_journal_seek_tail", c_int, handle_p)
        self._seek_cursor = bind("sd_journal_seek_cursor", c_int, handle_p, c_char_p)
        self._get_cursor = bind("sd_journal_get_cursor", c_int, handle_p, ctypes.POINTER(ctypes.c_void_p))
        self._test_cursor = bind("sd_journal_test_cursor", c_int, handle_p, c_char_p)
        self._previous = bind("sd_journal_previous", c_int, handle_p)
        self._query_unique = bind("sd_journal_query_unique", c_int, handle_p, c_char_p)
        # The "available" variant (systemd 246+) skips values in files it cannot read instead of failing.
        self._enumerate_unique_name = ("sd_journal_enumerate_available_unique"
                                       if hasattr(lib, "sd_journal_enumerate_available_unique")
                                       else "sd_journal_enumerate_unique")
        self._enumerate_unique = bind(self._enumerate_unique_name, c_int, handle_p, data_pp, size_p)
        self._get_fd = bind("sd_journal_get_fd", c_int, handle_p)
        self._process = bind("sd_journal_process", c_int, handle_p)
        self._wait = bind("sd_journal_wait", c_int, handle_p, c_uint64)
        self.raw_next = _untyped(lib, "sd_journal_next")
        self.raw_get_data = _untyped(lib, "sd_journal_get_data")
        self.raw_get_realtime_usec = _untyped(lib, "sd_journal_get_realtime_usec")
        self.raw_get_monotonic_usec = _untyped(lib, "sd_journal_get_monotonic_usec")
        libc = ctypes.CDLL(None, use_errno=True)
        self._free = libc.free
        self._free.restype = None
        self._free.argtypes = (ctypes.c_void_p,)

    # --- opening and closing ----------------------------------------------------------------

    def sd_journal_open(self, flags: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        _check(self._open(ctypes.byref(handle), flags), "sd_journal_open", "opening the system journal")
        return handle

    def sd_journal_open_directory(self, path: str, flags: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        _check(self._open_directory(ctypes.byref(handle), os.fsencode(path), flags), "sd_journal_open_directory",
               f"opening journal directory {path}")
        return handle

    def sd_journal_open_files(self, paths: Sequence[str], flags: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        array = (ctypes.c_char_p * (len(paths) + 1))(*(os.fsencode(path) for path in paths), None)
        _check(self._open_files(ctypes.byref(handle), array, flags), "sd_journal_open_files",
               "opening journal files " + ", ".join(paths))
        return handle

    def sd_journal_close(self, handle: ctypes.c_void_p) -> None:
        self._close(handle)

    def sd_journal_set_data_threshold(self, handle: ctypes.c_void_p, size: int) -> None:
        _check(self._set_data_threshold(handle, size), "sd_journal_set_data_threshold",
               "setting the journal's data threshold")

    # --- matches ----------------------------------------------------------------------------

    def sd_journal_add_match(self, handle: ctypes.c_void_p, match: bytes) -> None:
        _check(self._add_match(handle, match, len(match)), "sd_journal_add_match", "adding a journal match")

    def sd_journal_add_disjunction(self, handle: ctypes.c_void_p) -> None:
        _check(self._add_disjunction(handle), "sd_journal_add_disjunction", "adding a journal match")

    def sd_journal_add_conjunction(self, handle: ctypes.c_void_p) -> None:
        _check(self._add_conjunction(handle), "sd_journal_add_conjunction", "adding a journal match")

    def sd_journal_flush_matches(self, handle: ctypes.c_void_p) -> None:
        self._flush_matches(handle)

    # --- position ---------------------------------------------------------------------------

    def sd_journal_seek_head(self, handle: ctypes.c_void_p) -> None:
        _check(self._seek_head(handle), "sd_journal_seek_head", "seeking to the journal head")

    def sd_journal_seek_tail(self, handle: ctypes.c_void_p) -> None:
        _check(self._seek_tail(handle), "sd_journal_seek_tail", "seeking to the journal tail")

    def sd_journal_seek_cursor(self, handle: ctypes.c_void_p, cursor: bytes) -> None:
        _check(self._seek_cursor(handle, cursor), "sd_journal_seek_cursor", "seeking to the journal cursor")

    def sd_journal_get_cursor(self, handle: ctypes.c_void_p) -> bytes:
        pointer = ctypes.c_void_p()
        _check(self._get_cursor(handle, ctypes.byref(pointer)), "sd_journal_get_cursor",
               "getting the journal cursor")
        try:
            return ctypes.string_at(pointer.value)
        finally:
            self._free(pointer)

    def sd_journal_test_cursor(self, handle: ctypes.c_void_p, cursor: bytes) -> bool:
        """Whether the current entry is the one at ``cursor``."""
        return _check(self._test_cursor(handle, cursor), "sd_journal_test_cursor", "testing the journal cursor") > 0

    def sd_journal_next(self, handle: ctypes.c_void_p) -> bool:
        """Move to the next entry; False at the end."""
        return _check(self.raw_next(handle), "sd_journal_next", "reading the journal") > 0

    def sd_journal_previous(self, handle: ctypes.c_void_p) -> bool:
        """Move to the previous entry; False at the head."""
        return _check(self._previous(handle), "sd_journal_previous", "reading the journal") > 0

    # --- field values -----------------------------------------------------------------------

    def sd_journal_query_unique(self, handle: ctypes.c_void_p, field: bytes) -> None:
        _check(self._query_unique(handle, field), "sd_journal_query_unique", f"listing {field.decode()} values")

    def sd_journal_enumerate_unique(self, handle: ctypes.c_void_p) -> bytes | None:
        """The next ``FIELD=value`` of the queried field, or None after the last one.

        Calls ``sd_journal_enumerate_available_unique`` where libsystemd has it.
        """
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        result = _check(self._enumerate_unique(handle, ctypes.byref(data), ctypes.byref(size)),
                        self._enumerate_unique_name, "listing field values")
        return ctypes.string_at(data.value, size.value) if result > 0 else None

    # --- changes ----------------------------------------------------------------------------

    def sd_journal_get_fd(self, handle: ctypes.c_void_p) -> int:
        return _check(self._get_fd(handle), "sd_journal_get_fd", "watching the journal for changes")

    def sd_journal_process(self, handle: ctypes.c_void_p) -> int:
        """SD_JOURNAL_NOP, SD_JOURNAL_APPEND or SD_JOURNAL_INVALIDATE."""
        return _check(self._process(handle), "sd_journal_process", "processing journal changes")

    def sd_journal_wait(self, handle: ctypes.c_void_p, timeout_usec: int) -> int:
        """SD_JOURNAL_NOP (timed out), SD_JOURNAL_APPEND or SD_JOURNAL_INVALIDATE."""
        return _check(self._wait(handle, timeout_usec), "sd_journal_wait", "waiting for journal changes")


def _untyped(lib: ctypes.CDLL, name: str) -> Callable[..., int]:
    function = getattr(lib, name)
    function.restype = ctypes.c_int
    return function


def _check(result: int, function: str, doing: str) -> int:
    if result < 0:
        raise JournalError.of_result(function, result, doing)
    return result
