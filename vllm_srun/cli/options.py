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
from vllm_srun.cli.parsing import reads, shows
from vllm_srun.cli.secrets import redis_password
from vllm_srun.errors import SrunError
from vllm_srun.plugins.bodies import DTYPES, NUMERICS

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


def setting(parser: Any, flag: str, kind: Any, help: str, *aliases: str, **extra: Any) -> argparse.Action:
    """An option whose default is the `vllm_srun.defaults` constant of its name: --max-inputs
    defaults to MAX_INPUTS. `parser` may be an argument group."""
    default = getattr(defaults, flag.removeprefix("--").replace("-", "_").upper())
    action: argparse.Action = parser.add_argument(
        flag, *aliases, type=kind, default=default, help=help, **extra
    )
    return action


# `serve --help`'s groups, in its order: (title, what its options decide).
GROUPS = {
    "model": ("model", "what to serve, and the names requests use for it"),
    "numerics": (
        "numerics",
        "what the forwards compute in; /v1/models reports each model's dtype and profile",
    ),
    "batching": ("batching", "how a device worker fills one forward"),
    "limits": ("limits", "what one request, and this replica, may hold"),
    "redis": ("Redis", "the queue, the result cache and where they live"),
    "auth": ("auth", "who may call"),
    "jobs": ("jobs", "bulk jobs, their results and event streams"),
    "network": ("network", "where the server listens, and what a connection may hold"),
}


def option_groups(parser: argparse.ArgumentParser, *names: str) -> dict[str, Any]:
    """The argument groups `names` (keys of GROUPS) of `parser`, in GROUPS' order."""
    return {key: parser.add_argument_group(*GROUPS[key]) for key in GROUPS if key in names}


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


def add_model_options(groups: dict[str, Any]) -> None:
    """What to serve and how to batch it: `serve` and `worker` alike, in their `option_groups`
    model, numerics, batching, redis and jobs."""
    model, numerics, batching = groups["model"], groups["numerics"], groups["batching"]
    model.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="package directory, Hugging Face repo id[@revision], or built-in name",
    )
    model.add_argument(
        "--models",
        dest="models_file",
        type=Path,
        default=None,
        help="YAML file listing models and their options",
    )
    model.add_argument(
        "--config",
        dest="router_config",
        type=Path,
        default=None,
        help="router.yaml: serve its model_runtime deployments",
    )
    model.add_argument(
        "--served-model-name",
        action="append",
        nargs="+",
        metavar="NAME",
        default=None,
        help="the model's id, then aliases requests may use (as vLLM's); with several MODELs, give the "
        "flag once per MODEL, in their order [default: the name the package gives its model (its model "
        "card's title, or config.json's _name_or_path), its folder name an alias; a repository's id]",
    )
    model.add_argument("--family", default=None, help="model family, when several recognise the package")
    model.add_argument(
        "--allow-download",
        action="store_true",
        help="download a repository missing from the Hugging Face cache (never while HF_HUB_OFFLINE is set)",
    )
    reads(
        model.add_argument(
            "--cache-dir",
            type=Path,
            default=None,
            help="the Hugging Face cache that repository ids resolve in (and, with --allow-download, "
            "download to) [default: ~/.cache/huggingface/hub]",
        ),
        "HF_HUB_CACHE, else HF_HOME/hub",
    )
    setting(model, "--engine", str, "engine plugin name, or auto (by auto_priority)")
    setting(model, "--device", str, "device such as cpu, cuda:0, or auto")
    words = "; ".join(f"{name}: {text}" for name, text in NUMERICS.items())
    setting(
        numerics,
        "--dtype",
        str,
        f"what the forwards compute in. auto: float32; {words}. /v1/models reports the dtype and "
        "its profile in these words",
        choices=DTYPES,
    )
    numerics.add_argument(
        "--max-speed",
        action="store_true",
        help="pick the fastest dtype the device runs natively that passes its twin check against "
        "float32 (bfloat16, else int8, else float32); /v1/models reports that dtype and profile "
        "max_speed, as for --dtype bfloat16 or int8, and why it was chosen (dtype_reason)",
    )
    numerics.add_argument(
        "--bound",
        dest="bounds",
        action="append",
        type=bound,
        metavar="NAME=VALUE",
        default=None,
        help="set a bound of the twin check approximate numerics must pass, by the name "
        "/v1/models reports (e.g. min_cosine=0.995); repeatable [default: each kind of output's "
        "own bounds, listed on /v1/models]",
    )
    setting(
        numerics,
        "--intra-op-threads",
        POSITIVE,
        "threads per CPU forward (idle threads sleep); --threads is the router's name for it "
        "[default: every core]",
        "--threads",
    )
    setting(batching, "--max-num-seqs", POSITIVE, "most rows in one forward")
    setting(batching, "--max-num-batched-tokens", POSITIVE, "most tokens in one forward")
    setting(batching, "--batch-wait-ms", MILLISECONDS, "longest wait for more items when the device is idle")
    setting(groups["redis"], "--job-timeout-s", SECONDS, "a queue job running longer is retried elsewhere")
    setting(groups["redis"], "--cache-ttl-s", POSITIVE, "how long results stay in the cache")
    setting(groups["jobs"], "--job-ttl-s", POSITIVE, "how long bulk jobs and their results live")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="how much to log")


def add_redis_roles(parser: Any) -> None:
    """The result cache's own Redis, and whether an evicting main Redis refuses the start."""
    parser.add_argument(
        "--cache-redis",
        type=redis_url,
        default=None,
        help="Redis URL for result-cache entries only (may evict) [default: the main Redis]",
    )
    parser.add_argument(
        "--strict-redis",
        action="store_true",
        help="refuse to start when the main Redis's maxmemory-policy evicts keys",
    )


def add_connection_options(parser: Any) -> None:
    """What a client's connection may hold (vllm_srun.cli.connections); default: ConnectionLimits'."""
    add = parser.add_argument
    for flag, kind, help in (
        ("--header-timeout-s", SECONDS, "a request's headers arrive within this"),
        ("--body-idle-s", SECONDS, "longest gap in a request body being read"),
        ("--max-connections", POSITIVE, "open connections past this get 503"),
    ):
        field = flag.removeprefix("--").replace("-", "_")
        shows(add(flag, type=kind, default=None, help=help), partial(_limit_default, field))


def _limit_default(field: str) -> Any:
    from vllm_srun.cli.connections import ConnectionLimits

    return getattr(ConnectionLimits(), field)


def connection_limits(args: argparse.Namespace) -> Any:
    """The ConnectionLimits the connection options give; an option not given keeps its default."""
    from vllm_srun.cli.connections import ConnectionLimits

    given = {k: getattr(args, k) for k in ("header_timeout_s", "body_idle_s", "max_connections")}
    return ConnectionLimits(**{k: v for k, v in given.items() if v is not None})
