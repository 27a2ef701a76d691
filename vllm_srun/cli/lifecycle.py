"""How `serve`, `worker` and `proxy` listen and stop.

Sockets are bound before the models load, so a taken port stops the start at once. A stop
signal gives open connections GRACEFUL_STOP_S, then the process exits without joining threads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from vllm_srun.cli.managed import UDS_MODE, remove_socket, tcp_socket, unix_socket

# How long a stopping server waits for open connections (an event stream never closes by itself).
GRACEFUL_STOP_S = 5


def listening(args: argparse.Namespace) -> list[Any]:
    """The sockets `serve` answers on: --uds's unix socket, and the TCP port unless --uds is
    given without --port. Connections are accepted once the app is up."""
    import structlog

    log = structlog.get_logger("vllm_srun.http")
    sockets = []
    if args.uds is None or getattr(args, "port_given", False):
        sockets.append(tcp_socket(args.host, args.port))
        log.info("listening", url=f"http://{args.host}:{sockets[-1].getsockname()[1]}")
    if args.uds is not None:
        sockets.append(unix_socket(args.uds, args.uds_mode or UDS_MODE))
        log.info("listening", url=f"unix://{args.uds}")
    return sockets


def stopped(embedded_redis: Any, uds: Path | None, code: int, signum: int, frame: Any) -> None:
    """SIGTERM (exit 0) or SIGINT (exit 130, as after Ctrl-C), raised again by uvicorn once its
    graceful shutdown is done and the app's lifespan has closed: stop the embedded Redis and
    exit now. Leaving through asyncio.run instead would first join every thread of its default
    executor (a model still loading, a large request still tokenizing), for as long as they take."""
    if embedded_redis is not None:
        embedded_redis.stop()
    if uds is not None:
        remove_socket(uds)
    exit_now(code)


def stopping_server(config: Any, on_stop: Any) -> Any:
    """uvicorn's server, which tells the app (`on_stop(grace_s)`) as it stops taking connections,
    before it waits for the open ones: see `Runtime.stopping`."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
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
