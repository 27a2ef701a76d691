"""Typed argparse helpers and the option groups several subcommands share.

A number option is refused with its range; an option named after a `vllm_srun.defaults`
constant takes that constant as its default, so the command line holds no default of its own.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

from vllm_srun import defaults
from vllm_srun.cli.secrets import redis_password
from vllm_srun.errors import SrunError

LOG_LEVELS = ("debug", "info", "warning", "error")


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


def setting(
    parser: argparse.ArgumentParser, flag: str, kind: Any, help: str, *aliases: str, **extra: Any
) -> None:
    """An option whose default is the `vllm_srun.defaults` constant of its name: --max-inputs
    defaults to MAX_INPUTS."""
    default = getattr(defaults, flag.removeprefix("--").replace("-", "_").upper())
    parser.add_argument(flag, *aliases, type=kind, default=default, help=help, **extra)


class Given(argparse.Action):
    """Stores the value and records that the option was given (`<dest>_given`), for an option
    whose default applies only when another is absent (--port beside --uds)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def redis_url(url: str) -> str:
    """A Redis URL with $VLLM_SRUN_REDIS_PASSWORD (or $VLLM_SRUN_REDIS_PASSWORD_FILE's) as its
    password where it names none."""
    from urllib.parse import quote, urlsplit

    try:
        password = redis_password(os.environ)
    except SrunError as exc:  # argparse names the option: "argument --redis: ..."
        raise argparse.ArgumentTypeError(exc.message) from None
    parts = urlsplit(url)
    if not password or parts.scheme not in ("redis", "rediss") or parts.password is not None:
        return url
    user = quote(parts.username or "", safe="")
    return parts._replace(netloc=f"{user}:{quote(password, safe='')}@{parts.netloc}").geturl()


def bound(text: str) -> tuple[str, float]:
    """An argparse type: `NAME=VALUE`, a twin-check bound (vllm_srun.registry.bounds)."""
    from vllm_srun.registry.bounds import parse_bound

    try:
        return parse_bound(text)
    except SrunError as exc:  # argparse names the option: "argument --bound: ..."
        raise argparse.ArgumentTypeError(exc.message) from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """What to serve and how to batch it: `serve` and `worker` alike."""
    add = parser.add_argument
    from_defaults = partial(setting, parser)
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
    from_defaults("--engine", str, "engine plugin name, or auto (by auto_priority)")
    from_defaults("--device", str, "device such as cpu, cuda:0, or auto")
    from_defaults(
        "--dtype", str, "auto (float32 on CPU), float32, bfloat16, or int8 (int8 linears; cpu only)"
    )
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
        help="opt-in approximate numerics: the fastest dtype the device runs natively that passes "
        "its twin check against float32 (bfloat16, else int8, else float32)",
    )
    add(
        "--bound",
        dest="bounds",
        action="append",
        type=bound,
        metavar="NAME=VALUE",
        default=None,
        help="set a bound of the twin check approximate numerics must pass, by the name "
        "/v1/models reports (e.g. min_cosine=0.995); repeatable",
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
    from_defaults("--max-num-seqs", POSITIVE, "most rows in one forward")
    from_defaults("--max-num-batched-tokens", POSITIVE, "most tokens in one forward")
    from_defaults("--batch-wait-ms", MILLISECONDS, "longest wait for more items when the device is idle")
    from_defaults("--job-timeout-s", SECONDS, "a queue job running longer is retried elsewhere")
    from_defaults("--job-ttl-s", POSITIVE, "how long bulk jobs and their results live")
    from_defaults("--cache-ttl-s", POSITIVE, "how long results stay in the cache")
    from_defaults(
        "--intra-op-threads",
        POSITIVE,
        "threads per CPU forward (default: every core; idle threads sleep); --threads is the "
        "router's name for it",
        "--threads",
    )
    add("--log-level", default="info", choices=LOG_LEVELS, help="how much to log")


def add_redis_roles(parser: argparse.ArgumentParser) -> None:
    """The result cache's own Redis, and whether an evicting main Redis refuses the start."""
    parser.add_argument(
        "--cache-redis",
        type=redis_url,
        default=None,
        help="Redis URL for result-cache entries only (may evict); default: the main Redis",
    )
    parser.add_argument(
        "--strict-redis",
        action="store_true",
        help="refuse to start when the main Redis's maxmemory-policy evicts keys",
    )


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """What a client's connection may hold (vllm_srun.cli.connections); default: ConnectionLimits'."""
    add = parser.add_argument
    add("--header-timeout-s", type=SECONDS, default=None, help="a request's headers arrive within this")
    add("--body-idle-s", type=SECONDS, default=None, help="longest gap in a request body being read")
    add("--max-connections", type=POSITIVE, default=None, help="open connections past this get 503")


def connection_limits(args: argparse.Namespace) -> Any:
    """The ConnectionLimits the connection options give; an option not given keeps its default."""
    from vllm_srun.cli.connections import ConnectionLimits

    given = {k: getattr(args, k) for k in ("header_timeout_s", "body_idle_s", "max_connections")}
    return ConnectionLimits(**{k: v for k, v in given.items() if v is not None})
