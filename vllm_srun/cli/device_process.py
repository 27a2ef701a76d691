"""`serve --device-process`: the embedded default's device worker in a child process.

The child is `vllm-srun worker` on the private Redis, started from the same options, so the
forwards' Python and the HTTP event loop never share a GIL (as compose runs them). It exits
when the server stops it, and by itself within a second of the server's death.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from collections.abc import Callable

# How long a stop waits for the child to finish its batch before it is killed.
STOP_WAIT_S = 5.0
PARENT_POLL_S = 1.0


class DeviceProcess:
    """The child; `stop()` ends it (SIGTERM, then SIGKILL after STOP_WAIT_S)."""

    def __init__(self, args: argparse.Namespace, redis_url: str) -> None:
        # spawn, not fork: the parent has threads (the embedded Redis's reader), and a forked
        # child would inherit their locks.
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(
            target=_run, args=(args, redis_url, os.getpid()), name="vllm-srun-device", daemon=False
        )
        self.stopping = False
        self.process.start()

    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        self.stopping = True
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_WAIT_S)


def watch_device(device: DeviceProcess, on_exit: Callable[[str], None]) -> None:
    """Call `on_exit(why)` from a thread of its own if the child exits before `stop()`."""

    def watch() -> None:
        device.process.join()
        if not device.stopping:
            on_exit(f"the device process exited with code {device.process.exitcode}")

    threading.Thread(target=watch, daemon=True, name="device-watch").start()


def _run(args: argparse.Namespace, redis_url: str, parent: int) -> None:
    """The child's body: a worker's settings from the serve options, served until stopped."""
    import asyncio

    from vllm_srun.app.settings import ServerSettings
    from vllm_srun.cli.lifecycle import exit_now
    from vllm_srun.cli.startup import shared_settings
    from vllm_srun.cli.worker import run_worker
    from vllm_srun.logs import configure

    configure(args.log_level)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="parent-watch").start()
    settings = ServerSettings(
        **shared_settings(args), redis_url=redis_url, embedded=False, cache_redis_url=args.cache_redis
    )
    try:
        import uvloop
    except ImportError:
        exit_now(asyncio.run(run_worker(settings, None)))
    exit_now(uvloop.run(run_worker(settings, None)))


def _exit_with(parent: int) -> None:
    """Exit once the server that started this process is gone (even SIGKILLed)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
