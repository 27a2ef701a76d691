"""`serve --device-process`: the embedded default with its device worker in a child process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import RedisProcess, Server

from vllm_srun.cli.main import main


def _descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its command line."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, of in parents.items():
            if of == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                frontier.append(child)
    return found


def _device_pid(server: Server) -> int:
    spawned = [pid for pid, cmd in _descendants(server.proc.pid).items() if "spawn_main" in cmd]
    assert len(spawned) == 1, _descendants(server.proc.pid)
    return spawned[0]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether `pid` has exited within `timeout_s` (a zombie its new parent has not reaped yet
    has exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_the_device_process_serves_what_the_embedded_worker_does(
    start_server: Callable[..., Server], keywords: Path
) -> None:
    inline = start_server(str(keywords))
    split = start_server(str(keywords), "--device-process")
    device = _device_pid(split)
    log = split.log()
    # Announced only once the child serves the model.
    assert log.index("worker ready: keywords") < log.index('"listening"'), log
    texts = ["refund my order", "where is my parcel", "hello there"]
    want = inline.post("/v1/classify", {"input": texts})
    got = split.post("/v1/classify", {"input": texts})
    assert got.status_code == want.status_code == 200, got.text
    assert got.json()["results"] == want.json()["results"]
    assert split.get("/health").json()["states"] == {"keywords": "ready"}
    assert "worker ready" not in inline.log()  # the embedded default's worker is in-process
    assert device != split.proc.pid


def test_a_stop_ends_the_device_process_and_the_redis(
    start_server: Callable[..., Server], keywords: Path
) -> None:
    server = start_server(str(keywords), "--device-process")
    children = _descendants(server.proc.pid)
    assert any("spawn_main" in cmd for cmd in children.values()), children
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0, server.log()
    # The device process, the embedded Redis and multiprocessing's resource tracker (which
    # exits when its pipe from the server closes).
    left = [pid for pid in children if not _gone(pid)]
    assert not left, {pid: children[pid] for pid in left}
    assert "Traceback" not in server.log()


def test_a_device_process_that_dies_stops_the_server(
    start_server: Callable[..., Server], keywords: Path
) -> None:
    server = start_server(str(keywords), "--device-process")
    os.kill(_device_pid(server), signal.SIGKILL)
    # Exit 1, not a server left answering 503 with no worker: a supervisor starts it again.
    assert server.proc.wait(timeout=30) == 1, server.log()
    assert "the device process exited with code -9" in server.log()


def test_a_device_process_outlives_no_server_killed(start_server: Callable[..., Server], keywords: Path) -> None:
    server = start_server(str(keywords), "--device-process")
    device = _device_pid(server)
    server.proc.kill()
    server.proc.wait(timeout=10)
    assert _gone(device), "the device process outlived its server"


def test_device_process_takes_no_redis(
    capsys: pytest.CaptureFixture[str], keywords: Path, redis_proc: RedisProcess
) -> None:
    code = main(["serve", str(keywords), "--device-process", "--redis", redis_proc.url])
    assert code == 2
    assert "--device-process" in capsys.readouterr().err
