"""Following the web config file while the exporter runs (`ReloadingWebConfig`): a changed file, or a
certificate, key or CA file it names, is loaded again off the request path, and SIGHUP reloads it at once;
a config that would change what the listener promised at start is refused and the previous one kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from vllm_xpu_exporter.http.loading import file_fingerprint, load_web_config
from vllm_xpu_exporter.http.webconfig import FileState, WebConfig, WebConfigError

logger = logging.getLogger("vllm_xpu_exporter.webconfig")

_RELOAD_ATTEMPTS = 5


class ReloadingWebConfig:
    """Follows a web config file, as exporter-toolkit does ("read upon every http request").

    `current()` returns the config to use now and never waits: when the file or a certificate, key or CA
    file it names has changed since it was read, the file is loaded again on a thread of its own, and
    requests are served with the previous config until the new one is ready (a load reads files, builds
    the TLS context, and may be slow). What the listener promised at start stays:
    a reload may change certificates, client CAs, users, headers and the rate limit, but a config that
    would turn TLS on or off, stop requiring client certificates or drop basic auth is refused, and so
    is an empty file (a file being rewritten is empty for a moment) or one that does not load. A refused
    config keeps the previous one in force and is logged once as an error, so a certificate rotation
    that is half done never takes the exporter down nor opens it.

    `reload()` (SIGHUP, `systemctl reload`) loads the file at once, changed or not, with the same checks.
    """

    def __init__(self, config: WebConfig) -> None:
        self._config = config
        self._start = config
        self._fingerprint: Mapping[str, FileState] = config.fingerprint
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()  # one load applies at a time: a request's, or reload()'s
        self._reloading = False
        self._start_failure_logged = False

    def reload(self, occasion: str = "SIGHUP") -> bool:
        """Loads the file now, whether it changed or not, and applies it as a change would be (the same
        refusals); True when the new config is in force. Exactly one line says what happened: info when
        it is in force, else an error, and the previous config stays. Waits for a load that a request
        started, if one is running."""
        path = self._config.source_path
        if path is None:
            logger.info("received %s: the web config was not read from a file, nothing to reload", occasion)
            return False
        with self._apply_lock:
            before = self._config
            try:
                self._fingerprint = self._load_once(path, f"re-read on {occasion}", f" on {occasion}")
            except Exception as error:  # a bug must not take the exporter down on a reload
                logger.error("web config re-read on %s failed, keeping the previous one: %s", occasion,
                             type(error).__name__)
                logger.debug("web config reload failed", exc_info=True)
                return False
            return self._config is not before

    def current(self) -> WebConfig:
        config = self._config
        if config.source_path is not None and self._changed(self._fingerprint):
            self._start_reload(config.source_path)
        return config

    def _start_reload(self, path: str) -> None:
        with self._lock:
            if self._reloading:
                return
            self._reloading = True
        try:
            threading.Thread(target=self._reload, args=(path,), name="web-config-reload", daemon=True).start()
        except RuntimeError as error:  # no thread left (a task limit): the next request tries again
            with self._lock:
                self._reloading = False
            if not self._start_failure_logged:
                self._start_failure_logged = True
                logger.error("web config changed but cannot be reloaded now, keeping the previous one: %s", error)

    def _reload(self, path: str) -> None:
        try:
            for _attempt in range(_RELOAD_ATTEMPTS):
                with self._apply_lock:
                    self._fingerprint = self._load_once(path)
                if not self._changed(self._fingerprint):
                    break
                # A file changed while it was being read: read it again.
        except Exception as error:  # a bug must not stop later reloads
            logger.error("web config reload failed, keeping the previous one: %s", type(error).__name__)
            logger.debug("web config reload failed", exc_info=True)
        finally:
            self._start_failure_logged = False
            with self._lock:
                self._reloading = False

    @staticmethod
    def _changed(fingerprint: Mapping[str, FileState]) -> bool:
        return file_fingerprint(tuple(fingerprint)) != fingerprint

    def _load_once(self, path: str, what: str = "changed", done: str = "") -> Mapping[str, FileState]:
        """Loads the file and applies it if allowed, with one log line (`what` happened to the file; `done`
        ends the success line); returns the fingerprint to watch from now on, of the files as they were
        before they were read."""
        kept = self._config.fingerprint
        before = file_fingerprint((path,))
        try:
            config = load_web_config(path)
        except WebConfigError as error:
            logger.error("web config %s but cannot be used, keeping the previous one: %s", what, error)
            return {**kept, **before}
        refusal = self._refusal(config)
        if refusal is not None:
            logger.error("web config %s but %s, keeping the previous one: %s", what, refusal, path)
            return {**kept, **config.fingerprint}
        logger.info("web config reloaded from %s%s", path, done)
        self._config = config
        return config.fingerprint

    def _refusal(self, config: WebConfig) -> str | None:
        """Why `config` may not replace the running one, or None."""
        start = self._start
        if config.empty:
            return "the file is empty"
        if (config.ssl_context() is None) != (start.ssl_context() is None):
            return ("it would turn TLS " + ("off" if start.ssl_context() is not None else "on")
                    + " (the listener's scheme is fixed at start: restart to change it)")
        if start.requires_client_certificate and not config.requires_client_certificate:
            return "it would stop requiring client certificates (restart to change that)"
        if start.basic_auth_users and not config.basic_auth_users:
            return "it would turn basic auth off (restart to change that)"
        return None
