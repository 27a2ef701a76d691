"""`vllm-srun worker`: device workers for the models an app replica's Redis asks for.

Prints `worker ready: NAME, ...` once its models serve; exits 0 on SIGINT or SIGTERM, 1 when no
model could be served, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from vllm_srun.cli.lifecycle import exit_now
from vllm_srun.cli.options import (
    PORT,
    add_log_level,
    add_model_options,
    add_redis_roles,
    option_groups,
    redis_url,
)
from vllm_srun.cli.parsing import reads
from vllm_srun.cli.secrets import REDIS_PASSWORD_ENV, REDIS_PASSWORD_FILE_ENV
from vllm_srun.cli.startup import check_redis, shared_settings


def add_parsers(sub: Any) -> None:
    worker = sub.add_parser("worker", help="run a device worker for an app replica's Redis")
    groups = option_groups(worker, "model", "numerics", "batching", "redis", "jobs", "network")
    add_model_options(groups)
    reads(
        groups["redis"].add_argument(
            "--redis", type=redis_url, required=True, help="Redis URL shared with the app replicas"
        ),
        f"{REDIS_PASSWORD_ENV} or {REDIS_PASSWORD_FILE_ENV} for its password",
    )
    add_redis_roles(groups["redis"])
    add_log_level(worker)
    groups["network"].add_argument(
        "--metrics-port",
        type=PORT,
        default=None,
        help="serve this worker's metrics on a port (0: not served)",
    )


def cmd_worker(args: argparse.Namespace) -> int:
    from vllm_srun.app.settings import ServerSettings

    check_redis(args.redis, strict=args.strict_redis)
    if args.cache_redis:
        check_redis(args.cache_redis, flag="--cache-redis")
    if args.metrics_port:
        _check_port_free(args.metrics_port)
    settings = ServerSettings(
        **shared_settings(args), redis_url=args.redis, embedded=False, cache_redis_url=args.cache_redis
    )
    try:  # the event loop the server gets from uvicorn when uvloop is installed
        import uvloop
    except ImportError:
        return asyncio.run(run_worker(settings, args.metrics_port))
    return uvloop.run(run_worker(settings, args.metrics_port))


async def run_worker(settings: Any, metrics_port: int | None) -> int:
    """Serve `settings.models` from this process's devices until SIGINT or SIGTERM."""
    from vllm_srun.app.loading import Serving
    from vllm_srun.plugins.discovery import load_plugins

    plugins = load_plugins()
    serving = Serving.prepare(plugins, settings, with_device=True)
    await serving.start(_stats(plugins, metrics_port))
    await serving.loaded()
    if serving.config_error is not None:
        await serving.close()
        print(f"error: {serving.config_error}", file=sys.stderr)
        return 2
    ready = serving.ready()
    if not ready:
        await serving.close()
        reasons = "; ".join(f"{name}: {s.reason}" for name, s in serving.models.items())
        print(f"error: no model could be served: {reasons}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker ready: {', '.join(ready)}", file=sys.stderr, flush=True)
    await stop.wait()
    await serving.close()
    exit_now(0)  # not through asyncio.run's end, which joins its executor's threads


def _stats(plugins: Any, metrics_port: int | None) -> Any:
    """The worker's stat loggers; with a port, its Prometheus registry is served there."""
    from vllm_srun.app.runtime import sinks
    from vllm_srun.plugins.stats import Stats

    loggers = sinks(plugins)
    if metrics_port:
        from prometheus_client import start_http_server

        for sink in loggers:
            registry = getattr(sink, "registry", None)
            if registry is not None:
                start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    return Stats(loggers)


def _check_port_free(port: int) -> None:
    """Fail before the models load, not after, when --metrics-port is taken."""
    import socket

    from vllm_srun.errors import ConfigError

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: {exc.strerror or exc}") from exc
