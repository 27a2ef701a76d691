"""`vllm-srun proxy`: one published port in front of the app replicas.

Prints `listening: http://HOST:PORT` (the port the OS chose for port 0) before it serves; a
client's connection is bounded as `serve`'s are (`vllm_srun.cli.connections`). The ASGI app
is `vllm_srun.cli.forwarding.Proxy`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from vllm_srun import defaults
from vllm_srun.cli.lifecycle import GRACEFUL_STOP_S
from vllm_srun.cli.options import POSITIVE, SECONDS, add_connection_options, connection_limits

if TYPE_CHECKING:
    from vllm_srun.cli.connections import ConnectionLimits

MAX_UPSTREAM_CONNECTIONS = 512


def add_parsers(sub: Any) -> None:
    proxy = sub.add_parser("proxy", help="one port in front of app replicas: round-robin, streams unbuffered")
    proxy.add_argument("--listen", default=f"{defaults.HOST}:8000", help="HOST:PORT to accept clients on")
    proxy.add_argument(
        "--upstream",
        action="extend",
        nargs="+",
        required=True,
        help="app replica URL(s); a name may resolve to many",
    )
    proxy.add_argument(
        "--health-path", default="/health/live", help="what an upstream answers 200 on when up"
    )
    proxy.add_argument("--check-interval-s", type=SECONDS, default=2.0, help="seconds between health checks")
    add_connection_options(proxy)
    proxy.add_argument(
        "--max-upstream-connections",
        type=POSITIVE,
        default=None,
        help="connections to the replicas, at most (default: vllm_srun.cli.proxy.MAX_UPSTREAM_CONNECTIONS)",
    )


def cmd_proxy(args: argparse.Namespace) -> int:
    serve(
        args.listen,
        args.upstream,
        health_path=args.health_path,
        check_interval_s=args.check_interval_s,
        graceful_stop_s=GRACEFUL_STOP_S,
        limits=connection_limits(args),
        max_upstream_connections=args.max_upstream_connections or MAX_UPSTREAM_CONNECTIONS,
    )
    return 0


def serve(
    listen: str,
    upstreams: list[str],
    *,
    health_path: str,
    check_interval_s: float,
    graceful_stop_s: int,
    limits: ConnectionLimits | None = None,
    max_upstream_connections: int = MAX_UPSTREAM_CONNECTIONS,
) -> None:
    """Run the proxy on `listen` (HOST:PORT; port 0 takes one the OS picks, which the
    `listening` line names) until SIGINT or SIGTERM; connections still open `graceful_stop_s`
    after the signal (an event stream stays open for as long as its job runs) are closed then."""
    import uvicorn

    from vllm_srun.cli.connections import ConnectionLimits
    from vllm_srun.cli.forwarding import Proxy
    from vllm_srun.cli.managed import tcp_socket

    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    # Bound here, not by uvicorn, so that the port the OS chose for port 0 can be logged.
    sock = tcp_socket(host, int(port))
    shown = f"[{host}]" if ":" in host else host
    # Printed whatever the log level (the proxy logs warnings only), as the worker prints
    # "worker ready": the line a supervisor or a test reads the port from.
    print(f"listening: http://{shown}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    app = Proxy(
        upstreams,
        health_path=health_path,
        check_interval_s=check_interval_s,
        max_upstream_connections=max_upstream_connections,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=sock.getsockname()[1],
        log_config=None,
        access_log=False,
        interface="asgi3",
        lifespan="on",
        timeout_graceful_shutdown=graceful_stop_s,
        # scope["client"] is the socket peer: uvicorn would otherwise take it from a client's
        # X-Forwarded-For when it connects from 127.0.0.1.
        proxy_headers=False,
        # The replica's Date and Server are relayed; the proxy adds none of its own.
        server_header=False,
        date_header=False,
        **(limits or ConnectionLimits()).uvicorn_options(),
    )
    uvicorn.Server(config).run(sockets=[sock])
