"""What `serve` and `worker` both do before they run: settings from their options, Redis checked.

Every error here is a ConfigError raised before a model loads or a connection is accepted.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def model_settings(args: argparse.Namespace) -> tuple[Any, ...]:
    """Every model to serve: the MODEL arguments, then a --models file, then a --config file."""
    from vllm_srun.app.loading import check_names
    from vllm_srun.cli.config import Batching, ModelEntry, models_file, settings_of
    from vllm_srun.cli.router_config import router_models
    from vllm_srun.errors import ConfigError

    names: list[list[str]] = args.served_model_name or []
    if names and len(names) != len(args.models):
        raise ConfigError(
            f"--served-model-name: given {len(names)} times for {len(args.models)} MODEL(s); give it "
            "once per MODEL (NAME [ALIAS ...]), in their order, or not at all (put MODEL before it)"
        )
    batching = Batching(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        batch_wait_ms=args.batch_wait_ms,
    )
    out = [
        settings_of(
            ModelEntry(
                model=ref,
                name=names[i][0] if names else None,
                aliases=names[i][1:] if names else [],
                family=args.family,
                engine=args.engine,
                device=args.device,
                dtype=args.dtype,
                max_speed=args.max_speed,
                bounds=dict(args.bounds or ()),
                batching=batching,
            ),
            allow_download=args.allow_download,
        )
        for i, ref in enumerate(args.models)
    ]
    if args.models_file:
        out += models_file(args.models_file, allow_download=args.allow_download)
    if args.router_config:
        out += router_models(args.router_config, allow_download=args.allow_download)
    if not out:
        raise ConfigError(
            "no model to serve: name one (MODEL), or give --models FILE or --config router.yaml"
        )
    # Names given here clash or not before anything starts; default names (known once each
    # reference resolves) are checked again at start with the rest.
    check_names([(s.options.name, s.options.aliases) for s in out if s.options.name])
    return tuple(out)


def shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerSettings fields `serve` and `worker` both take from their options.

    In the order a start needs: the CPU thread policy before any engine imports torch, then
    the plugins, then the models (a wrong one refuses the start before Redis is touched).
    """
    from vllm_srun.cli.router_config import signal_checks
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.tuning import configure_cpu_threads

    threads = configure_cpu_threads(args.intra_op_threads)
    if args.cache_dir is not None:
        # Where repository ids resolve (vllm_srun.registry.resolve reads the variable
        # huggingface_hub does), for this process and the workers it starts.
        os.environ["HF_HUB_CACHE"] = str(args.cache_dir.expanduser())
    load_plugins()
    return {
        "models": model_settings(args),
        # The router's decision signals bound to a model served here, checked once it has loaded.
        "model_checks": signal_checks(args.router_config) if args.router_config else {},
        "job_timeout_s": args.job_timeout_s,
        "job_ttl_s": args.job_ttl_s,
        "cache_ttl_s": args.cache_ttl_s,
        "intra_op_threads": threads,
    }


def check_redis(url: str, *, strict: bool = False, flag: str = "--redis") -> None:
    """Reach the main Redis (or the cache's, `flag` --cache-redis) and read its eviction policy:
    an evicting main Redis is a warning, or with `strict` a refused start."""
    import redis
    import structlog

    from vllm_srun.errors import ConfigError
    from vllm_srun.queue.redis import UNKNOWN_POLICY, EvictionPolicy, check_cluster, describe_url, policy_of

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
    except ValueError as exc:  # redis-py's message lists the schemes it takes
        raise ConfigError(f"{flag} {url!r}: {exc}") from exc
    except (redis.RedisError, OSError) as exc:
        raise ConfigError(f"cannot reach Redis at {describe_url(url)}: {exc}") from exc
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
