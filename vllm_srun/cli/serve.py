"""`vllm-srun serve`: the HTTP server, with its own Redis and device worker unless --redis.

Exit 0 on SIGTERM, 130 on SIGINT, 2 on a configuration error (a --config check included);
the embedded Redis and the --uds socket are gone once it has exited.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

from vllm_srun.cli.lifecycle import GRACEFUL_STOP_S, announce, listening, stopped, stopping_server
from vllm_srun.cli.managed import file_mode, remove_socket
from vllm_srun.cli.options import (
    GROUPS,
    NON_NEGATIVE,
    PORT,
    POSITIVE,
    SECONDS,
    Given,
    add_connection_options,
    add_log_level,
    add_model_options,
    add_redis_roles,
    connection_limits,
    option_groups,
    redis_url,
    setting,
)
from vllm_srun.cli.parsing import reads, shows
from vllm_srun.cli.secrets import API_KEY_ENV, API_KEY_FILE_ENV, REDIS_PASSWORD_ENV, REDIS_PASSWORD_FILE_ENV
from vllm_srun.cli.startup import check_redis, shared_settings

# How often the announcement of a server with --device-process asks whether its worker is up.
ANNOUNCE_POLL_S = 0.1


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the HTTP server (with its own Redis and worker unless --redis)")
    groups = option_groups(serve, *GROUPS)
    add_model_options(groups)
    limits, redis, auth, jobs, network = (groups[k] for k in ("limits", "redis", "auth", "jobs", "network"))
    setting(limits, "--max-request-bytes", POSITIVE, "largest request body")
    setting(limits, "--max-inputs", POSITIVE, "most inputs in one request")
    setting(limits, "--max-bundle-tasks", POSITIVE, "most tasks in one POST /v1/bundle")
    setting(
        limits,
        "--max-concurrent-requests",
        POSITIVE,
        "surface requests served at once by this replica; past it, 429 with Retry-After (TEI's flag)",
    )
    setting(limits, "--max-queued-items", POSITIVE, "bound on queued items per model")
    setting(limits, "--max-queued-tokens", POSITIVE, "bound on queued tokens per model")
    setting(limits, "--request-timeout-s", SECONDS, "longest wait for a result")
    limits.add_argument(
        "--auto-truncate",
        action="store_true",
        help="truncate over-long inputs of requests that set no options.overflow (TEI's flag)",
    )
    reads(
        redis.add_argument(
            "--redis",
            type=redis_url,
            default=None,
            help="Redis URL; makes this process an app replica only [default: a private Redis of its own]",
        ),
        f"{REDIS_PASSWORD_ENV} or {REDIS_PASSWORD_FILE_ENV} for its password",
    )
    add_redis_roles(redis)
    groups["batching"].add_argument(
        "--device-process",
        action="store_true",
        help="run the private device worker in a process of its own, as compose runs it, so "
        "forwards and the HTTP event loop never share a GIL (without --redis only)",
    )
    setting(
        redis,
        "--local-cache-mb",
        NON_NEGATIVE,
        "recent results kept in this process in front of the Redis cache (0: none)",
    )
    reads(
        auth.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help="require this key"),
        API_KEY_ENV,
    )
    reads(
        auth.add_argument(
            "--api-key-file",
            type=Path,
            default=os.environ.get(API_KEY_FILE_ENV),
            help="take every key in this file, one per line, each a caller of its own",
        ),
        API_KEY_FILE_ENV,
    )
    auth.add_argument(
        "--shared-cache",
        action="store_true",
        help="with several API keys, share cached results between them (default: each key's apart)",
    )
    auth.add_argument(
        "--allowed-hosts",
        default=None,
        help="Host names served, comma-separated; * for any [default: with no API key, the bind "
        "address and localhost]",
    )
    setting(jobs, "--max-job-requests", POSITIVE, "most requests in one bulk job")
    setting(jobs, "--max-job-bytes", POSITIVE, "largest bulk job body in bytes")
    for flag, help in (
        ("--max-queued-job-items", "items of all jobs not yet run, at most"),
        ("--max-job-result-bytes", "result bytes one job may store"),
        ("--max-stored-result-bytes", "result bytes all jobs may store"),
    ):
        field = flag.removeprefix("--").replace("-", "_")
        shows(jobs.add_argument(flag, type=POSITIVE, default=None, help=help), partial(_quota_default, field))
    setting(
        jobs, "--max-event-streams", POSITIVE, "job event streams open at once on this replica (429 past it)"
    )
    setting(jobs, "--max-event-streams-per-caller", POSITIVE, "job event streams one caller may hold open")
    setting(jobs, "--event-stream-connections", POSITIVE, "Redis connections the event streams share")
    setting(jobs, "--event-batch-bytes", POSITIVE, "bytes of results one read of an event stream holds")
    setting(network, "--host", str, "address to bind")
    setting(network, "--port", PORT, "port to bind (with --uds, only when given)", action=Given)
    network.add_argument(
        "--uds",
        type=Path,
        default=None,
        help="serve HTTP on this unix socket too (alone unless --port is given)",
    )
    network.add_argument(
        "--uds-mode",
        type=file_mode,
        default=None,
        help="the socket's permissions in octal [default: 600, its owner only]",
    )
    add_connection_options(network)
    add_log_level(serve)


def _quota_default(field: str) -> Any:
    from vllm_srun.queue.jobs import BulkQuotas

    return getattr(BulkQuotas(), "max_queued_items" if field == "max_queued_job_items" else field)


def _bulk_quotas(args: argparse.Namespace) -> Any:
    """What bulk jobs may hold in the state Redis; an option not given keeps BulkQuotas' default."""
    from vllm_srun.queue.jobs import BulkQuotas

    given = {
        "max_queued_items": args.max_queued_job_items,
        "max_job_result_bytes": args.max_job_result_bytes,
        "max_stored_result_bytes": args.max_stored_result_bytes,
    }
    return BulkQuotas(**{k: v for k, v in given.items() if v is not None})


def _server_settings(args: argparse.Namespace, shared: dict[str, Any], **given: Any) -> Any:
    """The app's ServerSettings: `shared` (as the worker's), this command's options, `given`."""
    from vllm_srun.app.settings import ServerSettings
    from vllm_srun.app.tenants import read_key_file

    return ServerSettings(
        **shared,
        **given,
        max_request_bytes=args.max_request_bytes,
        max_inputs=args.max_inputs,
        max_bundle_tasks=args.max_bundle_tasks,
        max_concurrent_requests=args.max_concurrent_requests,
        local_cache_mb=args.local_cache_mb,
        max_queued_items=args.max_queued_items,
        max_queued_tokens=args.max_queued_tokens,
        request_timeout_s=args.request_timeout_s,
        api_key=args.api_key,
        api_keys=tuple(read_key_file(args.api_key_file)) if args.api_key_file else (),
        shared_cache=args.shared_cache,
        max_event_streams=args.max_event_streams,
        max_event_streams_per_caller=args.max_event_streams_per_caller,
        event_stream_connections=args.event_stream_connections,
        event_batch_bytes=args.event_batch_bytes,
        max_job_requests=args.max_job_requests,
        max_job_bytes=args.max_job_bytes,
        bulk_quotas=_bulk_quotas(args),
        auto_truncate=args.auto_truncate,
        cache_redis_url=args.cache_redis,
    )


async def _announce(app: Any, args: argparse.Namespace, sockets: list[Any], server: Any) -> None:
    """Say where the server listens once its models are loaded (each ready or failed), unless
    it is stopping by then (a --config check refused a model)."""
    runtime = app.state.runtime
    await runtime.serving.loaded()
    states = {name: served.state for name, served in runtime.serving.models.items()}
    if runtime.settings.device_process:  # ... and the device process serves them
        from vllm_srun.app.service.health import model_states

        while not server.should_exit:
            states = {name: s.state for name, s in (await model_states(runtime)).items()}
            if "no_worker" not in states.values():
                break
            await asyncio.sleep(ANNOUNCE_POLL_S)
    if not server.should_exit:
        announce(args, sockets, states)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vllm_srun.app.guard import BrowserGuard, default_hosts, parse_hosts
    from vllm_srun.app.main import create_app, stop_serving
    from vllm_srun.cli.device_process import DeviceProcess, watch_device
    from vllm_srun.cli.embedded_redis import EmbeddedRedis
    from vllm_srun.errors import ConfigError

    shared = shared_settings(args)
    stopped_by: list[tuple[str, int]] = []
    server: Any = None

    def stop_on(message: str, code: int = 2) -> None:
        # A loaded model that fails a --config check stops the start, as a bad flag does; so
        # does a device process that exits (code 1: a supervisor starts the server again).
        stopped_by.append((message, code))
        if server is not None:  # else the server, once made, is told before it runs
            server.should_exit = True

    if args.device_process and args.redis is not None:
        raise ConfigError("--device-process runs the private device worker: it takes no --redis")
    embedded_redis = EmbeddedRedis() if args.redis is None else None
    url = embedded_redis.start() if embedded_redis else args.redis
    private: list[Any] = [embedded_redis] if embedded_redis else []
    try:
        if embedded_redis is None:
            check_redis(url, strict=args.strict_redis)
        if args.cache_redis:
            check_redis(args.cache_redis, flag="--cache-redis")
        if args.device_process:
            device = DeviceProcess(args, url)
            private.insert(0, device)  # stopped before the Redis it serves from
            watch_device(device, lambda message: stop_on(message, code=1))
        settings = _server_settings(
            args,
            shared,
            redis_url=url,
            embedded=embedded_redis is not None,
            device_process=args.device_process,
            on_config_error=stop_on,
        )
        app = create_app(settings)
        hosts = default_hosts(args.host, api_key=args.api_key or next(iter(settings.api_keys), None))
        if args.allowed_hosts is not None:
            hosts = parse_hosts(args.allowed_hosts)
        config = uvicorn.Config(
            BrowserGuard(app, allowed_hosts=hosts),
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
            **connection_limits(args).uvicorn_options(),
        )
        sockets = listening(args)
        # uvicorn shuts down on SIGTERM or SIGINT, then raises the signal again under the handler
        # found at start. The default SIGTERM one would end the process before Redis is stopped;
        # the default SIGINT one is asyncio's, which cancels a task, and a cancellation caught on
        # the way out left the process exiting 0 instead of 130.
        signal.signal(signal.SIGTERM, partial(stopped, private, args.uds, 0))
        signal.signal(signal.SIGINT, partial(stopped, private, args.uds, 130))
        server = stopping_server(config, partial(stop_serving, app), partial(_announce, app, args, sockets))
        server.should_exit = bool(stopped_by)
        server.run(sockets=sockets)
        if stopped_by:
            message, code = stopped_by[0]
            if code == 2:
                raise ConfigError(message)
            print(f"error: {message}", file=sys.stderr)
            return code
        return 0
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down; no traceback
        return 130
    finally:
        for service in private:
            service.stop()
        if args.uds is not None:
            remove_socket(args.uds)
