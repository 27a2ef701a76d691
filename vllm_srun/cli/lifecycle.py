"""How `serve`, `worker` and `proxy` listen and stop.

Sockets are bound before the models load, so a taken port stops the start at once; `serve`
logs `listening` once every model is loaded (ready or failed), never for a start it refuses. A
stop signal gives open connections GRACEFUL_STOP_S, then the process exits without joining threads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from vllm_srun.cli.managed import UDS_MODE, remove_socket, tcp_socket, unix_socket

# How long a stopping server waits for open connections (an event stream never closes by itself).
GRACEFUL_STOP_S = 5


def listening(args: argparse.Namespace) -> list[Any]:
    """The sockets `serve` answers on, bound: --uds's unix socket, and the TCP port unless
    --uds is given without --port. Connections are accepted once the app is up."""
    sockets = []
    if args.uds is None or getattr(args, "port_given", False):
        sockets.append(tcp_socket(args.host, args.port))
    if args.uds is not None:
        sockets.append(unix_socket(args.uds, args.uds_mode or UDS_MODE))
    return sockets


def announce(args: argparse.Namespace, sockets: list[Any], models: dict[str, str]) -> None:
    """Log where `serve` listens, one `listening` line per socket of `listening(args)`, with
    each model's state."""
    import socket

    import structlog

    log = structlog.get_logger("vllm_srun.http")
    for sock in sockets:
        if sock.family == socket.AF_UNIX:
            log.info("listening", url=f"unix://{args.uds}", models=models)
        else:
            log.info("listening", url=f"http://{args.host}:{sock.getsockname()[1]}", models=models)


def stopped(private: Sequence[Any], uds: Path | None, code: int, signum: int, frame: Any) -> None:
    """SIGTERM (exit 0) or SIGINT (exit 130, as after Ctrl-C), raised again by uvicorn once its
    graceful shutdown is done and the app's lifespan has closed: stop the private services (a
    device process, then the embedded Redis) and exit now. Leaving through asyncio.run instead would first join every thread of its default
    executor (a model still loading, a large request still tokenizing), for as long as they take."""
    for service in private:
        service.stop()
    if uds is not None:
        remove_socket(uds)
    exit_now(code)


def stopping_server(config: Any, on_stop: Any, on_started: Any = None) -> Any:
    """uvicorn's server, which tells the app (`on_stop(grace_s)`) as it stops taking connections,
    before it waits for the open ones: see `Runtime.stopping`. Once it takes connections it
    runs `on_started(server)`, a coroutine function, as a task of its own."""
    import asyncio

    import uvicorn

    class StoppingServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if on_started is not None and self.started and not self.should_exit:
                self.announcing = asyncio.get_running_loop().create_task(on_started(self))

        async def shutdown(self, sockets: Any = None) -> None:
            if getattr(self, "announcing", None) is not None:
                self.announcing.cancel()  # stopping while the models load: nothing to announce
            on_stop(GRACEFUL_STOP_S)
            await super().shutdown(sockets)

    return StoppingServer(config)


def exit_now(code: int) -> NoReturn:
    """End a stopped `serve` or `worker` now. Everything it holds is released by then (leases
    given back, connections closed, Redis stopped); what is left is a forward thread that may be
    midway through a batch nobody waits for, and the interpreter would join it before exiting."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
