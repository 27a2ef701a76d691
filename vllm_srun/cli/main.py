"""`vllm-srun`: serve, worker, plugins, devices, models, fixture, check-config, jobs."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from vllm_srun import defaults
from vllm_srun.cli.secrets import API_KEY_ENV, API_KEY_FILE_ENV
from vllm_srun.errors import SrunError
from vllm_srun.cli.managed import file_mode, remove_socket

# Left in a directory `vllm-srun fixture` wrote, so writing there again may replace it.
FIXTURE_MARKER = ".vllm-srun-fixture"
LOG_LEVELS = ("debug", "info", "warning", "error")
# How long a stopping server waits for open connections (an event stream never closes by itself).
GRACEFUL_STOP_S = 5


def _number(kind: type[int] | type[float], *, low: float, high: float | None = None) -> Any:
    """An argparse type: a number in [low, high], refused with the range otherwise."""
    bounds = f">= {low}" if high is None else f"between {low} and {high}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {bounds}")
        return value

    parse.__name__ = kind.__name__  # what argparse shows in "invalid <name> value"
    return parse


POSITIVE = _number(int, low=1)
NON_NEGATIVE = _number(int, low=0)
PORT = _number(int, low=0, high=65535)
SECONDS = _number(float, low=0.001)
MILLISECONDS = _number(float, low=0)


def _setting(
    parser: argparse.ArgumentParser, flag: str, kind: Any, help: str, *aliases: str, **extra: Any
) -> None:
    """An option whose default is the `vllm_srun.defaults` constant of its name: --max-inputs
    defaults to MAX_INPUTS, so the command line cannot hold a default of its own."""
    default = getattr(defaults, flag.removeprefix("--").replace("-", "_").upper())
    parser.add_argument(flag, *aliases, type=kind, default=default, help=help, **extra)


class _Given(argparse.Action):
    """Stores the value and records that the option was given (`<dest>_given`), for an option
    whose default applies only when another is absent (--port beside --uds)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _model_args(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    setting = partial(_setting, parser)
    add(
        "models",
        nargs="*",
        metavar="MODEL",
        help="package directory, Hugging Face repo id[@revision], or built-in name",
    )
    add(
        "--models",
        dest="models_file",
        type=Path,
        default=None,
        help="YAML file listing models and their options",
    )
    add(
        "--config",
        dest="router_config",
        type=Path,
        default=None,
        help="router.yaml: serve its model_runtime deployments",
    )
    setting("--engine", str, "engine plugin name, or auto (by auto_priority)")
    setting("--device", str, "device such as cpu, cuda:0, or auto")
    setting("--dtype", str, "auto (float32 on CPU), float32, bfloat16")
    add("--family", default=None, help="model family, when several recognise the package")
    add(
        "--served-model-name",
        action="append",
        nargs="+",
        metavar="NAME",
        default=None,
        help="the model's id, then aliases requests may use (as vLLM's); with several MODELs, "
        "give the flag once per MODEL, in their order",
    )
    add(
        "--max-speed",
        action="store_true",
        help="opt-in approximate numerics (int8 linears on cpu), refused unless they match float32",
    )
    add(
        "--allow-download",
        action="store_true",
        help="download a repository missing from the Hugging Face cache",
    )
    add(
        "--cache-dir",
        type=Path,
        default=None,
        help="the Hugging Face cache that repository ids resolve in (and, with --allow-download, "
        "download to); default: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub",
    )
    setting("--max-num-seqs", POSITIVE, "most rows in one forward")
    setting("--max-num-batched-tokens", POSITIVE, "most tokens in one forward")
    setting("--batch-wait-ms", MILLISECONDS, "longest wait for more items when the device is idle")
    setting("--job-timeout-s", SECONDS, "a queue job running longer is retried elsewhere")
    setting("--job-ttl-s", POSITIVE, "how long bulk jobs and their results live")
    setting("--cache-ttl-s", POSITIVE, "how long results stay in the cache")
    setting(
        "--intra-op-threads",
        POSITIVE,
        "threads per CPU forward (default: every core; idle threads sleep); --threads is the "
        "router's name for it",
        "--threads",
    )
    add("--log-level", default="info", choices=LOG_LEVELS, help="how much to log")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-srun", description="Serve small encoder models over HTTP.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server (with its own Redis and worker unless --redis)")
    _model_args(serve)
    add = serve.add_argument
    add("--redis", type=_redis_url, default=None, help="Redis URL; makes this process an app replica only")
    _redis_roles(serve)
    setting = partial(_setting, serve)
    setting("--host", str, f"address to bind (default {defaults.HOST})")
    setting("--port", PORT, "port to bind (with --uds, only when given)", action=_Given)
    add(
        "--uds",
        type=Path,
        default=None,
        help="serve HTTP on this unix socket too (alone unless --port is given)",
    )
    add(
        "--uds-mode",
        type=file_mode,
        default=None,
        help="the socket's permissions in octal (default 600: its owner only)",
    )
    setting("--max-request-bytes", POSITIVE, "largest request body")
    setting("--max-inputs", POSITIVE, "most inputs in one request")
    setting("--max-bundle-tasks", POSITIVE, "most tasks in one POST /v1/bundle")
    setting(
        "--max-concurrent-requests",
        POSITIVE,
        "surface requests served at once by this replica; past it, 429 with Retry-After (TEI's flag)",
    )
    setting(
        "--local-cache-mb",
        NON_NEGATIVE,
        "recent results kept in this process in front of the Redis cache (0: none)",
    )
    setting("--max-queued-items", POSITIVE, "bound on queued items per model")
    setting("--max-queued-tokens", POSITIVE, "bound on queued tokens per model")
    setting("--request-timeout-s", SECONDS, "longest wait for a result")
    setting("--max-job-requests", POSITIVE, "most requests in one bulk job")
    setting("--max-job-bytes", POSITIVE, "largest bulk job body in bytes")
    add("--api-key", default=os.environ.get(API_KEY_ENV), help=f"require this key (or ${API_KEY_ENV})")
    add(
        "--api-key-file",
        type=Path,
        default=os.environ.get(API_KEY_FILE_ENV),
        help=f"take every key in this file, one per line, each a caller of its own (or ${API_KEY_FILE_ENV})",
    )
    add(
        "--shared-cache",
        action="store_true",
        help="with several API keys, share cached results between them (default: each key's apart)",
    )
    setting("--max-event-streams", POSITIVE, "job event streams open at once on this replica (429 past it)")
    setting("--max-event-streams-per-caller", POSITIVE, "job event streams one caller may hold open")
    setting("--event-stream-connections", POSITIVE, "Redis connections the event streams share")
    setting("--event-batch-bytes", POSITIVE, "bytes of results one read of an event stream holds")
    _connection_args(serve)
    add(
        "--allowed-hosts",
        default=None,
        help="Host names served, comma-separated; * for any (default: with no API key, the bind "
        "address and localhost)",
    )
    add("--max-queued-job-items", type=POSITIVE, default=None, help="items of all jobs not yet run, at most")
    add("--max-job-result-bytes", type=POSITIVE, default=None, help="result bytes one job may store")
    add("--max-stored-result-bytes", type=POSITIVE, default=None, help="result bytes all jobs may store")
    add(
        "--auto-truncate",
        action="store_true",
        help="truncate over-long inputs of requests that set no options.overflow (TEI's flag)",
    )

    worker = sub.add_parser("worker", help="run a device worker for an app replica's Redis")
    _model_args(worker)
    worker.add_argument(
        "--redis", type=_redis_url, required=True, help="Redis URL shared with the app replicas"
    )
    _redis_roles(worker)
    worker.add_argument(
        "--metrics-port",
        type=PORT,
        default=None,
        help="serve this worker's metrics on a port (0: not served)",
    )

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
    _connection_args(proxy)
    proxy.add_argument(
        "--max-upstream-connections",
        type=POSITIVE,
        default=None,
        help="connections to the replicas, at most (default: vllm_srun.cli.proxy.MAX_UPSTREAM_CONNECTIONS)",
    )

    plugins = sub.add_parser("plugins", help="list installed families, engines, accelerators, stat loggers")
    plugins.add_argument("--json", action="store_true", help="print JSON")

    sub.add_parser("devices", help="print JSON: each accelerator's devices and the one --device auto takes")

    models = sub.add_parser("models", help="list the built-in models and their pins")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.add_argument(
        "--architectures",
        action="store_true",
        help="list the architectures that load (model types, classes, heads) instead",
    )

    fixture = sub.add_parser("fixture", help="write a small model package with a family's fixture writer")
    fixture.add_argument("out", type=Path, help="directory to write")
    fixture.add_argument("--family", required=True, help="family whose fixture writer to run")
    fixture.add_argument("--variant", default=None, help="which fixture the writer makes")
    fixture.add_argument("--onnx", action="store_true", help="also export an ONNX graph")

    check = sub.add_parser(
        "check-config", help="check a router.yaml's endpoints and decision signals against what they serve"
    )
    check.add_argument("config", type=Path, help="the router configuration")
    check.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help="key for the endpoints")
    check.add_argument(
        "--timeout-s", type=SECONDS, default=defaults.CHECK_TIMEOUT_S, help="per-endpoint timeout"
    )

    init = sub.add_parser(
        "init-secrets",
        help="write the Redis password and API key files a deployment reads, once (compose's secret-init)",
    )
    init.add_argument("directory", type=Path, help="where the files go (the secrets volume)")
    init.add_argument("--owner", type=_owner, default=None, help="UID:GID of app and workers' files")
    init.add_argument("--redis-owner", type=_owner, default=None, help="UID:GID of Redis's password file")
    sub.add_parser(
        "api-key", help=f"print the API key clients send (from ${API_KEY_FILE_ENV} or ${API_KEY_ENV})"
    )

    # Listed for --help only: main() hands everything after "bench" to the bench's own parser.
    sub.add_parser("bench", help="run the benchmark from the repository root (vllm-srun bench --help)")

    from vllm_srun.cli.jobs import add_jobs_parser

    add_jobs_parser(sub)
    return parser


def _model_settings(args: argparse.Namespace) -> tuple[Any, ...]:
    """Every model to serve: the MODEL arguments, then a --models file, then a --config file."""
    from vllm_srun.cli.main import config
    from vllm_srun.errors import ConfigError

    names: list[list[str]] = args.served_model_name or []
    if names and len(names) != len(args.models):
        raise ConfigError(
            f"--served-model-name: given {len(names)} times for {len(args.models)} MODEL(s); give it "
            "once per MODEL (NAME [ALIAS ...]), in their order, or not at all (put MODEL before it)"
        )
    batching = config.Batching(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        batch_wait_ms=args.batch_wait_ms,
    )
    out = [
        config.settings_of(
            config.ModelEntry(
                model=ref,
                name=names[i][0] if names else None,
                aliases=names[i][1:] if names else [],
                family=args.family,
                engine=args.engine,
                device=args.device,
                dtype=args.dtype,
                max_speed=args.max_speed,
                batching=batching,
            ),
            allow_download=args.allow_download,
        )
        for i, ref in enumerate(args.models)
    ]
    if args.models_file:
        out += config.models_file(args.models_file, allow_download=args.allow_download)
    if args.router_config:
        out += config.router_models(args.router_config, allow_download=args.allow_download)
    if not out:
        raise ConfigError(
            "no model to serve: name one (MODEL), or give --models FILE or --config router.yaml"
        )
    from vllm_srun.app.loading import check_names

    # Names given here clash or not before anything starts; default names (known once each
    # reference resolves) are checked again at start with the rest.
    check_names([(s.options.name, s.options.aliases) for s in out if s.options.name])
    return tuple(out)


def _redis_url(url: str) -> str:
    """A Redis URL with $VLLM_SRUN_REDIS_PASSWORD (or $VLLM_SRUN_REDIS_PASSWORD_FILE's) as its
    password where it names none."""
    from urllib.parse import quote, urlsplit

    from vllm_srun.cli.secrets import redis_password

    try:
        password = redis_password(os.environ)
    except SrunError as exc:  # argparse names the option: "argument --redis: ..."
        raise argparse.ArgumentTypeError(exc.message) from None
    parts = urlsplit(url)
    if not password or parts.scheme not in ("redis", "rediss") or parts.password is not None:
        return url
    user = quote(parts.username or "", safe="")
    return parts._replace(netloc=f"{user}:{quote(password, safe='')}@{parts.netloc}").geturl()


def _owner(text: str) -> Any:
    from vllm_srun.cli.secrets import Owner

    try:
        return Owner.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _connection_args(parser: argparse.ArgumentParser) -> None:
    """What a client's connection may hold (vllm_srun.cli.connections); default: ConnectionLimits'."""
    add = parser.add_argument
    add("--header-timeout-s", type=SECONDS, default=None, help="a request's headers arrive within this")
    add("--body-idle-s", type=SECONDS, default=None, help="longest gap in a request body being read")
    add("--max-connections", type=POSITIVE, default=None, help="open connections past this get 503")


def _connection_limits(args: argparse.Namespace) -> Any:
    from vllm_srun.cli.connections import ConnectionLimits

    given = {k: getattr(args, k) for k in ("header_timeout_s", "body_idle_s", "max_connections")}
    return ConnectionLimits(**{k: v for k, v in given.items() if v is not None})


def _bulk_quotas(args: argparse.Namespace) -> Any:
    """What bulk jobs may hold in the state Redis; an option not given keeps BulkQuotas' default."""
    from vllm_srun.queue.jobs import BulkQuotas

    given = {
        "max_queued_items": args.max_queued_job_items,
        "max_job_result_bytes": args.max_job_result_bytes,
        "max_stored_result_bytes": args.max_stored_result_bytes,
    }
    return BulkQuotas(**{k: v for k, v in given.items() if v is not None})


def _redis_roles(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-redis",
        type=_redis_url,
        default=None,
        help="Redis URL for result-cache entries only (may evict); default: the main Redis",
    )
    parser.add_argument(
        "--strict-redis",
        action="store_true",
        help="refuse to start when the main Redis's maxmemory-policy evicts keys",
    )


def _check_redis(url: str, *, strict: bool = False, flag: str = "--redis") -> None:
    """Reach the main Redis (or the cache's, `flag` --cache-redis) and read its eviction policy:
    an evicting main Redis is a warning, or with `strict` a refused start."""
    import redis
    import structlog

    from vllm_srun.errors import ConfigError
    from vllm_srun.queue.redis import UNKNOWN_POLICY, EvictionPolicy, describe_url, policy_of

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
    except ValueError as exc:  # redis-py's message lists the schemes it takes
        raise ConfigError(f"{flag} {url!r}: {exc}") from exc
    except (redis.RedisError, OSError) as exc:
        raise ConfigError(f"cannot reach Redis at {describe_url(url)}: {exc}") from exc
    from vllm_srun.queue.redis import check_cluster

    check_cluster(url, flag=flag)
    if flag != "--redis":
        return
    try:
        policy = policy_of(client.config_get("maxmemory-policy"))
    except redis.ResponseError:  # CONFIG renamed or refused: say so and go on
        policy = EvictionPolicy(UNKNOWN_POLICY)
    log = structlog.get_logger("vllm_srun.redis")
    if policy.maxmemory_policy == UNKNOWN_POLICY:
        log.warning("redis_policy_unknown", hint="CONFIG is refused: make sure it is noeviction")
        return
    if policy.warning is None:
        return
    if strict:
        raise ConfigError(f"--strict-redis: {policy.warning}")
    log.warning("redis_evicts", maxmemory_policy=policy.maxmemory_policy, warning=policy.warning)


def _shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerSettings fields `serve` and `worker` both take from their options.

    In the order a start needs: the CPU thread policy before any engine imports torch, then
    the plugins, then the models (a wrong one refuses the start before Redis is touched).
    """
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.tuning import configure_cpu_threads

    threads = configure_cpu_threads(args.intra_op_threads)
    if args.cache_dir is not None:
        # Where repository ids resolve (vllm_srun.registry.resolve reads the variable
        # huggingface_hub does), for this process and the workers it starts.
        os.environ["HF_HUB_CACHE"] = str(args.cache_dir.expanduser())
    load_plugins()
    return {
        "models": _model_settings(args),
        # The router's decision signals, once the models they ask have loaded.
        "model_checks": _model_checks(args),
        "job_timeout_s": args.job_timeout_s,
        "job_ttl_s": args.job_ttl_s,
        "cache_ttl_s": args.cache_ttl_s,
        "intra_op_threads": threads,
    }


def _model_checks(args: argparse.Namespace) -> dict[str, Any]:
    """The router's decision signals bound to a model served here, checked once it has loaded."""
    from vllm_srun.cli.config import signal_checks

    return signal_checks(args.router_config) if args.router_config else {}


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vllm_srun.app.main import create_app, stop_serving
    from vllm_srun.app.settings import ServerSettings
    from vllm_srun.app.tenants import read_key_file
    from vllm_srun.errors import ConfigError
    from vllm_srun.cli.embedded_redis import EmbeddedRedis

    shared = _shared_settings(args)
    stopped_by: list[str] = []

    def stop_on(message: str) -> None:
        # A loaded model that fails a --config check stops the start, as a bad flag does.
        stopped_by.append(message)
        server.should_exit = True

    embedded_redis = EmbeddedRedis() if args.redis is None else None
    url = embedded_redis.start() if embedded_redis else args.redis
    try:
        if embedded_redis is None:
            _check_redis(url, strict=args.strict_redis)
        if args.cache_redis:
            _check_redis(args.cache_redis, flag="--cache-redis")
        settings = ServerSettings(
            **shared,
            redis_url=url,
            embedded=embedded_redis is not None,
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
            on_config_error=stop_on,
        )
        app = create_app(settings)
        from vllm_srun.app.guard import BrowserGuard, default_hosts, parse_hosts

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
            **_connection_limits(args).uvicorn_options(),
        )
        sockets = _listening(args)
        # uvicorn shuts down on SIGTERM or SIGINT, then raises the signal again under the handler
        # found at start. The default SIGTERM one would end the process before Redis is stopped;
        # the default SIGINT one is asyncio's, which cancels a task, and a cancellation caught on
        # the way out left the process exiting 0 instead of 130 (seen once under load).
        signal.signal(signal.SIGTERM, partial(_stopped, embedded_redis, args.uds, 0))
        signal.signal(signal.SIGINT, partial(_stopped, embedded_redis, args.uds, 130))
        server = _stopping_server(config, partial(stop_serving, app))
        server.run(sockets=sockets)
        if stopped_by:
            raise ConfigError(stopped_by[0])
        return 0
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down; no traceback
        return 130
    finally:
        if embedded_redis is not None:
            embedded_redis.stop()
        if args.uds is not None:
            remove_socket(args.uds)


def _listening(args: argparse.Namespace) -> list[Any]:
    """The sockets `serve` answers on: --uds's unix socket, and the TCP port unless --uds is
    given without --port. Bound before the models load, so a taken port or a bad socket path
    stops the start at once; connections are accepted once the app is up."""
    import structlog

    from vllm_srun.cli.managed import UDS_MODE, tcp_socket, unix_socket

    log = structlog.get_logger("vllm_srun.http")
    sockets = []
    if args.uds is None or getattr(args, "port_given", False):
        sockets.append(tcp_socket(args.host, args.port))
        log.info("listening", url=f"http://{args.host}:{sockets[-1].getsockname()[1]}")
    if args.uds is not None:
        sockets.append(unix_socket(args.uds, args.uds_mode or UDS_MODE))
        log.info("listening", url=f"unix://{args.uds}")
    return sockets


def _stopped(embedded_redis: Any, uds: Path | None, code: int, signum: int, frame: Any) -> None:
    """SIGTERM (exit 0) or SIGINT (exit 130, as after Ctrl-C), raised again by uvicorn once its
    graceful shutdown is done and the app's lifespan has closed: stop the embedded Redis and
    exit now. Leaving through asyncio.run instead would first join every thread of its default
    executor (a model still loading, a large request still tokenizing), for as long as they take."""
    if embedded_redis is not None:
        embedded_redis.stop()
    if uds is not None:
        remove_socket(uds)
    _exit_now(code)


def _stopping_server(config: Any, on_stop: Any) -> Any:
    """uvicorn's server, which tells the app (`on_stop(grace_s)`) as it stops taking connections,
    before it waits for the open ones: see `Runtime.stopping`."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            on_stop(GRACEFUL_STOP_S)
            await super().shutdown(sockets)

    return StoppingServer(config)


def _exit_now(code: int) -> NoReturn:
    """End a stopped `serve` or `worker` now. Everything it holds is released by then (leases
    given back, connections closed, Redis stopped); what is left is a forward thread that may be
    midway through a batch nobody waits for, and the interpreter would join it before exiting."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _run_worker(settings: Any, metrics_port: int | None) -> int:
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
    _exit_now(0)  # not through asyncio.run's end, which joins its executor's threads: see _stopped


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


def cmd_worker(args: argparse.Namespace) -> int:
    from vllm_srun.app.settings import ServerSettings

    _check_redis(args.redis, strict=args.strict_redis)
    if args.cache_redis:
        _check_redis(args.cache_redis, flag="--cache-redis")
    if args.metrics_port:
        _check_port_free(args.metrics_port)
    settings = ServerSettings(
        **_shared_settings(args), redis_url=args.redis, embedded=False, cache_redis_url=args.cache_redis
    )
    try:  # the event loop the server gets from uvicorn when uvloop is installed
        import uvloop
    except ImportError:
        return asyncio.run(_run_worker(settings, args.metrics_port))
    return uvloop.run(_run_worker(settings, args.metrics_port))


def cmd_proxy(args: argparse.Namespace) -> int:
    from vllm_srun.cli.proxy import MAX_UPSTREAM_CONNECTIONS, serve

    serve(
        args.listen,
        args.upstream,
        health_path=args.health_path,
        check_interval_s=args.check_interval_s,
        graceful_stop_s=GRACEFUL_STOP_S,
        limits=_connection_limits(args),
        max_upstream_connections=args.max_upstream_connections or MAX_UPSTREAM_CONNECTIONS,
    )
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from vllm_srun.accelerators._torch import torch_or_none
    from vllm_srun.plugins.discovery import GROUPS, load_plugins

    torch_or_none()  # loaded here so that torch-based accelerators report what they find
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


def cmd_devices(args: argparse.Namespace) -> int:
    """What the router asks before it places a deployment on `auto` (see vllm_srun.cli.managed)."""
    from vllm_srun.accelerators._torch import torch_or_none
    from vllm_srun.cli.managed import devices_report
    from vllm_srun.plugins.discovery import load_plugins

    torch_or_none()  # loaded so that torch-based accelerators report what they find
    report = devices_report(load_plugins())
    print(json.dumps(report))
    if report["auto"] is None:
        print("error: no accelerator is available for --device auto", file=sys.stderr)
        return 1
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.tables import describe_tables, load_tables

    if args.architectures:
        return _print_architectures(as_json=args.json)

    tables = load_tables(e.plugin for e in load_plugins().of("families").values())
    rows = describe_tables(tables)
    if args.json:
        print(json.dumps({"models": rows, "conflict": tables.conflict}, indent=2))
    else:
        for row in rows:
            print(
                f"{row['name']:<24} {row['family']:<18} {row['repository']}@{row['revision'][:12]}  "
                f"sha256 {row['model_sha256'][:16]}  {row['licence']}"
            )
    for skipped in tables.skipped:
        print(f"skipped table {skipped.module}: {skipped.reason}", file=sys.stderr)
    if tables.conflict:
        print(f"error: {tables.conflict}", file=sys.stderr)
        return 2
    return 0


def _print_architectures(*, as_json: bool) -> int:
    """Every row of the architecture table (built-in and from plugins): what loads natively.
    Any other model type serves from its package's onnx/model.onnx."""
    from vllm_srun.plugins.architectures import architectures
    from vllm_srun.plugins.discovery import load_plugins

    load_plugins()  # plugins' rows join the table
    rows = [arch.descriptor() for arch in architectures()]
    if as_json:
        print(json.dumps({"architectures": rows}, indent=2))
        return 0
    for row in rows:
        kinds = sorted({kind for kind in row["classes"].values()})
        print(f"{row['name']:<12} model_type {', '.join(row['model_types']):<34} heads {', '.join(kinds)}")
        for cls, kind in row["classes"].items():
            print(f"    {cls:<44} {kind}")
    print("any other model_type: serves on onnxruntime from its onnx/model.onnx")
    return 0


def cmd_fixture(args: argparse.Namespace) -> int:
    from vllm_srun.errors import ConfigError
    from vllm_srun.plugins.discovery import load_plugins

    out: Path = args.out  # "" parses as ".": refused below unless the current directory is empty
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{str(out)!r} is not a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / FIXTURE_MARKER).is_file():
            raise ConfigError(f"{str(out)!r} exists and is not empty: give a new or empty directory")
        shutil.rmtree(out)  # a fixture this command wrote before: replaced whole, no stale files
    family = load_plugins().family(args.family)
    if not family.fixture_writer:
        raise ConfigError(f"family {args.family!r} has no fixture writer")
    module_name, _, attr = family.fixture_writer.partition(":")
    writer = getattr(importlib.import_module(module_name), attr)
    try:
        written = writer(out, variant=args.variant, onnx=args.onnx)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    (Path(written) / FIXTURE_MARKER).write_text("written by `vllm-srun fixture`; rewritten in place\n")
    print(written)
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Each endpoint deployment serves its model, then each decision signal bound to one is
    answered there; a malformed signal is a configuration error before anything is asked."""
    from vllm_srun.cli.config import check_endpoints, check_signals

    signals = check_signals(args.config, timeout_s=args.timeout_s, api_key=args.api_key)
    checks = check_endpoints(args.config, timeout_s=args.timeout_s, api_key=args.api_key) + signals
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.deployment} @ {check.endpoint}: {check.detail}")
    if not checks:
        print("no model_runtime deployment with an endpoint to check")
    return 0 if all(c.ok for c in checks) else 1


def cmd_bench(bench_args: list[str]) -> int:
    """`python -m bench` from a checkout: the bench lives beside the package, not in it."""
    sys.path.insert(0, os.getcwd())
    try:
        from bench.__main__ import main as bench_main
    except ImportError as exc:
        from vllm_srun.errors import ConfigError

        raise ConfigError(
            f"run `vllm-srun bench` from the repository root (bench/ not found: {exc})"
        ) from exc
    result: int = bench_main(bench_args[1:] if bench_args[:1] == ["--"] else bench_args)
    return result


def cmd_init_secrets(args: argparse.Namespace) -> int:
    from vllm_srun.cli.secrets import init_secrets

    done = init_secrets(args.directory, env=os.environ, owner=args.owner, redis_owner=args.redis_owner)
    for name, action in done.items():
        print(f"{args.directory / name}: {action}")
    return 0


def cmd_api_key(args: argparse.Namespace) -> int:
    from vllm_srun.cli.secrets import api_key

    print(api_key(os.environ))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from vllm_srun.cli.jobs import cmd_jobs as run

    return run(args)


COMMANDS = {
    "serve": cmd_serve,
    "worker": cmd_worker,
    "plugins": cmd_plugins,
    "devices": cmd_devices,
    "models": cmd_models,
    "fixture": cmd_fixture,
    "check-config": cmd_check_config,
    "proxy": cmd_proxy,
    "jobs": cmd_jobs,
    "init-secrets": cmd_init_secrets,
    "api-key": cmd_api_key,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["bench"]:  # every option after it is the bench's (--quick, --texts N, ...)
            return cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        from vllm_srun.logs import configure

        configure(getattr(args, "log_level", "warning") if args.command in ("serve", "worker") else "warning")
        return COMMANDS[args.command](args)
    except SrunError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2

