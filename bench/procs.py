"""The processes the bench starts: `vllm-srun serve` (embedded or replica), a Redis server, and
their memory read from /proc (Linux; elsewhere memory figures are None).

Every process listens on 127.0.0.1 only and is stopped by `stop()` (the callers use `finally`).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from vllm_srun.cli.embedded_redis import find_redis_server

HOST = "127.0.0.1"
LINE_NUMBER = re.compile(r":\d+\)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Proc:
    """A subprocess whose output goes to a temporary log, shown when it fails."""

    def __init__(
        self, args: list[str], name: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.args = args
        self._log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()
        self.log_path.unlink(missing_ok=True)


class HTTPProc(Proc):
    """A server process answering HTTP at `self.url` (set by the subclass before starting)."""

    url: str

    def wait_ready(self, path: str = "/health", timeout_s: float = 180.0) -> HTTPProc:
        """Until `path` answers 200 (bounded by `timeout_s`); raises with the log otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log_tail()}")


class Server(HTTPProc):
    """`vllm-srun serve MODEL --port P [extra]` on a free port of 127.0.0.1."""

    def __init__(self, model: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        args = [sys.executable, "-m", "vllm_srun.cli", "serve", model, "--port", str(self.port)]
        super().__init__([*args, "--host", HOST, "--log-level", "warning", *extra], "serve")


class Redis(Proc):
    """A redis-server (the bundled binary unless one is on PATH) on a TCP port of 127.0.0.1."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        args = [find_redis_server(), "--port", str(self.port), "--bind", HOST, "--save", ""]
        super().__init__([*args, "--appendonly", "no"], "redis")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")


# Memory, from /proc: no dependency beyond the standard library.


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def rss_mb(pid: int) -> float | None:
    """Resident memory of one process now (VmRSS), in MB (10^6 bytes)."""
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else kb * 1024 / 1e6


def hwm_mb(pid: int) -> float | None:
    """Peak resident memory of one process so far (VmHWM), in MB."""
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else kb * 1024 / 1e6


def comm(pid: int) -> str:
    """The process's command name (`python`, `redis-server`)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def main_thread_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of a process's main thread: the server's event loop, where the
    app and an embedded worker run, apart from the forward's threads."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/*/stat parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 1000:
        current = todo.pop()
        out.append(current)
        todo += parents.get(current, [])
    return out


class RssSampler:
    """Samples the summed VmRSS of a process tree every `interval_s` in a thread; `peak_mb`."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_mb: float | None = None
        self._pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def watch(self, pid: int | None) -> None:
        """Sample this process and its children from now on (None: stop sampling). The tree is
        read once here (a server's children start before it is ready), so a sample is cheap."""
        self._pids = [] if pid is None else tree(pid)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        known = [s for s in map(rss_mb, self._pids) if s is not None]
        if known:
            self.peak_mb = max(self.peak_mb or 0.0, sum(known))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Profiler:
    """`py-spy record` on a process while a shape runs (collapsed stacks in `path`), when
    py-spy is installed; `top()` names the functions most often on top of the stack."""

    def __init__(self, pid: int, path: Path, rate: int = 100) -> None:
        self.path = path
        args = ["py-spy", "record", "-p", str(pid), "-o", str(path), "--format", "raw", "-r", str(rate)]
        self.proc = subprocess.Popen(
            [*args, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def top(self, count: int = 15) -> list[tuple[str, float, float]]:
        """(function, share of samples on top of the stack, share anywhere in it), busiest first."""
        own: dict[str, int] = {}
        anywhere: dict[str, int] = {}
        total = 0
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        for line in lines:
            stack, _, samples = line.rpartition(" ")
            if not samples.isdigit():
                continue
            frames = [LINE_NUMBER.sub(")", f) for f in stack.split(";")]  # a function, not a line
            n = int(samples)
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                anywhere[frame] = anywhere.get(frame, 0) + n
        busiest = sorted(own, key=lambda f: -own[f])[:count]
        return [(f, own[f] / total, anywhere[f] / total) for f in busiest] if total else []
