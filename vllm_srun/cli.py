"""`vllm-srun`: serve, worker, plugins, fixture."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from vllm_srun.errors import SrunError

API_KEY_ENV = "VLLM_SRUN_API_KEY"


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model package directories to serve")
    parser.add_argument("--engine", default="auto", help="engine plugin name, or auto (by auto_priority)")
    parser.add_argument("--device", default="auto", help="device such as cpu, cuda:0, or auto")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU), float32, bfloat16")
    parser.add_argument("--family", default=None, help="model family, when several recognise the package")
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        help="name to serve a model under (once per model)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most rows in one forward")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=16384, help="most tokens in one forward"
    )
    parser.add_argument(
        "--batch-wait-ms", type=float, default=2.0, help="longest wait for more items when the device is idle"
    )
    parser.add_argument(
        "--job-timeout-s", type=float, default=300.0, help="a queue job running longer is retried elsewhere"
    )
    parser.add_argument(
        "--job-ttl-s", type=int, default=86400, help="how long bulk jobs and their results live"
    )
    parser.add_argument("--cache-ttl-s", type=int, default=3600, help="how long results stay in the cache")
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-srun", description="Serve small encoder models over HTTP.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server (with its own Redis and worker unless --redis)")
    _model_args(serve)
    serve.add_argument("--redis", default=None, help="Redis URL; makes this process an app replica only")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind")
    serve.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024, help="largest request body")
    serve.add_argument("--max-inputs", type=int, default=2048, help="most inputs in one request")
    serve.add_argument(
        "--max-queued-items", type=int, default=100_000, help="bound on queued items per model"
    )
    serve.add_argument(
        "--max-queued-tokens", type=int, default=10_000_000, help="bound on queued tokens per model"
    )
    serve.add_argument("--request-timeout-s", type=float, default=60.0, help="longest wait for a result")
    serve.add_argument(
        "--max-job-requests", type=int, default=1_000_000, help="most requests in one bulk job"
    )
    serve.add_argument(
        "--max-job-bytes", type=int, default=512 * 1024 * 1024, help="largest bulk job body in bytes"
    )
    serve.add_argument(
        "--api-key", default=os.environ.get(API_KEY_ENV), help=f"require this key (or ${API_KEY_ENV})"
    )

    worker = sub.add_parser("worker", help="run a device worker for an app replica's Redis")
    _model_args(worker)
    worker.add_argument("--redis", required=True, help="Redis URL shared with the app replicas")
    worker.add_argument(
        "--metrics-port", type=int, default=None, help="serve this worker's metrics on a port"
    )

    plugins = sub.add_parser("plugins", help="list installed families, engines, accelerators, stat loggers")
    plugins.add_argument("--json", action="store_true", help="print JSON")

    fixture = sub.add_parser("fixture", help="write a small model package with a family's fixture writer")
    fixture.add_argument("out", type=Path, help="directory to write")
    fixture.add_argument("--family", required=True, help="family whose fixture writer to run")
    fixture.add_argument("--variant", default=None, help="which fixture the writer makes")
    fixture.add_argument("--onnx", action="store_true", help="also export an ONNX graph")
    return parser


def _model_options(args: argparse.Namespace) -> tuple[Any, ...]:
    from vllm_srun.errors import ConfigError
    from vllm_srun.registry.loader import ModelOptions

    names = args.served_model_name or []
    if names and len(names) != len(args.models):
        raise ConfigError("--served-model-name: give one per model, or none")
    return tuple(
        ModelOptions(
            ref=ref,
            name=names[i] if names else None,
            family=args.family,
            engine=args.engine,
            device=args.device,
            dtype=args.dtype,
        )
        for i, ref in enumerate(args.models)
    )


def _limits(args: argparse.Namespace) -> Any:
    from vllm_srun.queue.coalescer import BatchLimits

    return BatchLimits(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        batch_wait_ms=args.batch_wait_ms,
    )


def _check_redis(url: str) -> None:
    import redis

    from vllm_srun.errors import ConfigError
    from vllm_srun.queue.redis import describe_url

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except (redis.RedisError, OSError) as exc:
        raise ConfigError(f"cannot reach Redis at {describe_url(url)}: {exc}") from exc


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vllm_srun.app.main import create_app
    from vllm_srun.app.runtime import ServerSettings
    from vllm_srun.plugins.registry import load_plugins
    from vllm_srun.queue.redis_server import EmbeddedRedis

    load_plugins()
    models = _model_options(args)
    embedded_redis = EmbeddedRedis() if args.redis is None else None
    url = embedded_redis.start() if embedded_redis else args.redis
    try:
        if embedded_redis is None:
            _check_redis(url)
        settings = ServerSettings(
            models=models,
            redis_url=url,
            embedded=embedded_redis is not None,
            limits=_limits(args),
            max_request_bytes=args.max_request_bytes,
            max_inputs=args.max_inputs,
            max_queued_items=args.max_queued_items,
            max_queued_tokens=args.max_queued_tokens,
            request_timeout_s=args.request_timeout_s,
            cache_ttl_s=args.cache_ttl_s,
            api_key=args.api_key,
            job_timeout_s=args.job_timeout_s,
            job_ttl_s=args.job_ttl_s,
            max_job_requests=args.max_job_requests,
            max_job_bytes=args.max_job_bytes,
        )
        app = create_app(settings)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_config=None, access_log=False, lifespan="on"
        )
        server = uvicorn.Server(config)
        server.run()
        if not server.started:
            failure = getattr(app.state, "startup_error", None)
            print(f"error: the server did not start{': ' + failure if failure else ''}", file=sys.stderr)
            return 1
        return 0
    finally:
        if embedded_redis is not None:
            embedded_redis.stop()


async def _run_worker(args: argparse.Namespace) -> None:
    from vllm_srun.app.runtime import ServedModel, ServerSettings, _sinks, start_worker
    from vllm_srun.plugins.registry import load_plugins
    from vllm_srun.plugins.stats import Stats
    from vllm_srun.registry.loader import load_model

    plugins = load_plugins()
    settings = ServerSettings(
        models=_model_options(args),
        redis_url=args.redis,
        embedded=False,
        limits=_limits(args),
        job_timeout_s=args.job_timeout_s,
        job_ttl_s=args.job_ttl_s,
        cache_ttl_s=args.cache_ttl_s,
    )
    models = {}
    for options in settings.models:
        model, placement = await asyncio.to_thread(load_model, plugins, options, with_engine=True)
        models[model.info.name] = ServedModel(model, placement)
    sinks = _sinks(plugins)
    if args.metrics_port:
        from prometheus_client import start_http_server

        for sink in sinks:
            registry = getattr(sink, "registry", None)
            if registry is not None:
                start_http_server(args.metrics_port, addr="127.0.0.1", registry=registry)
    worker = start_worker(settings, models, Stats(sinks))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    print(f"worker ready: {', '.join(models)}", file=sys.stderr, flush=True)
    await stop.wait()
    await worker.close()


def cmd_worker(args: argparse.Namespace) -> int:
    _check_redis(args.redis)
    asyncio.run(_run_worker(args))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from vllm_srun.plugins.registry import GROUPS, load_plugins

    described = load_plugins().describe()
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    for group in GROUPS:
        print(f"{group}:")
        for entry in described[group]:
            print(f"  {entry['name']:<20} {entry['distribution']} {entry['version']}  ({entry['target']})")
    if described["refused"]:
        print("refused:")
        for entry in described["refused"]:
            print(f"  {entry['group']}/{entry['name']} from {entry['distribution']}: {entry['reason']}")
    return 0


def cmd_fixture(args: argparse.Namespace) -> int:
    from vllm_srun.errors import ConfigError
    from vllm_srun.plugins.registry import load_plugins

    family = load_plugins().family(args.family)
    if not family.fixture_writer:
        raise ConfigError(f"family {args.family!r} has no fixture writer")
    module_name, _, attr = family.fixture_writer.partition(":")
    writer = getattr(importlib.import_module(module_name), attr)
    try:
        out = writer(args.out, variant=args.variant, onnx=args.onnx)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    print(out)
    return 0


COMMANDS = {"serve": cmd_serve, "worker": cmd_worker, "plugins": cmd_plugins, "fixture": cmd_fixture}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vllm_srun.logs import configure

    configure(getattr(args, "log_level", "warning") if args.command in ("serve", "worker") else "warning")
    try:
        return COMMANDS[args.command](args)
    except SrunError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
