"""Every default is read from `vllm_srun.defaults`, not written again.

Comparing each surface's defaults with the module's values would pass for a literal that
happens to be equal today. So a fresh interpreter first replaces every constant of
`vllm_srun.defaults` with a value of its own, then imports the command line, the `--models`
file and router-config readers, the app's settings and the coalescer and reports what they
default to: a surface that wrote a literal shows the old value and fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vllm_srun import defaults

NAMES = sorted(n for n in vars(defaults) if n.isupper())

PROBE = textwrap.dedent(
    """
    import dataclasses, inspect, json, sys
    from pathlib import Path

    import vllm_srun.defaults as d

    for name, value in json.loads(sys.argv[1]).items():
        setattr(d, name, value)

    from vllm_srun.cli import check_config, config, router_config, startup
    from vllm_srun.cli.main import build_parser
    from vllm_srun.app.settings import ModelSettings, ServerSettings
    from vllm_srun.families.task_heads.layout import Layout
    from vllm_srun.plugins.package import ModelPackage, checkpoint_max_tokens
    from vllm_srun.queue.worker.coalescer import BatchLimits

    def model(settings: ModelSettings) -> dict:
        o = settings.options
        return {"engine": o.engine, "device": o.device, "dtype": o.dtype, **vars(settings.limits)}

    parser = build_parser()
    models_file, router_file = Path(sys.argv[2]), Path(sys.argv[3])
    out = {
        "serve": vars(parser.parse_args(["serve", "m"])),
        "worker": vars(parser.parse_args(["worker", "m", "--redis", "redis://localhost"])),
        "check-config": vars(parser.parse_args(["check-config", "router.yaml"])),
        "models-file": model(config.models_file(models_file)[0]),
        "router-config": model(router_config.router_models(router_file)[0]),
        "cli-model": model(startup.model_settings(parser.parse_args(["serve", "m"]))[0]),
        "server-settings": {
            f.name: f.default
            for f in dataclasses.fields(ServerSettings)
            if f.default is not dataclasses.MISSING
        },
        "batch-limits": vars(BatchLimits()),
        "model-settings": vars(ModelSettings(options=None).limits),
        "layout-max-tokens": next(f.default for f in dataclasses.fields(Layout) if f.name == "max_tokens"),
        "checkpoint-max-tokens": checkpoint_max_tokens(ModelPackage(models_file.parent), {}, None),
        "check-endpoints-timeout": inspect.signature(check_config.check_endpoints).parameters["timeout_s"].default,
    }
    print(json.dumps(out, default=str))
    """
)


def _stand_ins() -> dict[str, Any]:
    """A value for each constant that no surface could hold by chance: distinct, same kind."""
    out: dict[str, Any] = {}
    for i, name in enumerate(NAMES):
        value = getattr(defaults, name)
        if isinstance(value, str):
            out[name] = f"stand-in-{i}"
        elif isinstance(value, float):
            out[name] = 1000.25 + i
        else:  # int, or None for "the runtime chooses"
            out[name] = 1000 + i
    return out


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("defaults")
    (tmp / "models.yaml").write_text("models:\n  - model: some/package\n")
    (tmp / "router.yaml").write_text(
        "global:\n  model_catalog:\n    deployments:\n"
        "      - {name: d, provider: model_runtime, artifact: some/package}\n"
    )
    stand_ins = _stand_ins()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            json.dumps(stand_ins),
            str(tmp / "models.yaml"),
            str(tmp / "router.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[1],  # this checkout's vllm_srun, not an installed copy
    )
    assert proc.returncode == 0, proc.stderr
    return stand_ins, json.loads(proc.stdout)


def _follows(stand_ins: dict[str, Any], values: dict[str, Any]) -> set[str]:
    """The defaults names `values` (settings by their field names) hold; fails on any it does not."""
    named = {k: v for k, v in values.items() if k.upper() in stand_ins}
    wrong = {k: v for k, v in named.items() if v != stand_ins[k.upper()]}
    assert not wrong, f"defaults written as literals, not read from vllm_srun.defaults: {wrong}"
    return {k.upper() for k in named}


BATCHING = {"MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "BATCH_WAIT_MS"}
# A batch limit with no command-line option: what a deployment's BatchLimits holds beside BATCHING.
COALESCING = {"SMALL_REQUEST_ITEMS"}
PLACEMENT = {"ENGINE", "DEVICE", "DTYPE"}
SHARED = {*PLACEMENT, *BATCHING, "JOB_TIMEOUT_S", "JOB_TTL_S", "CACHE_TTL_S", "INTRA_OP_THREADS"}
SERVE_ONLY = {
    "HOST",
    "PORT",
    "MAX_REQUEST_BYTES",
    "MAX_INPUTS",
    "MAX_BUNDLE_TASKS",
    "MAX_CONCURRENT_REQUESTS",
    "LOCAL_CACHE_MB",
    "MAX_QUEUED_ITEMS",
    "MAX_QUEUED_TOKENS",
    "REQUEST_TIMEOUT_S",
    "MAX_JOB_REQUESTS",
    "MAX_JOB_BYTES",
    "MAX_EVENT_STREAMS",
    "MAX_EVENT_STREAMS_PER_CALLER",
    "EVENT_STREAM_CONNECTIONS",
    "EVENT_BATCH_BYTES",
}


def test_the_command_line_reads_every_default(seen: tuple[dict[str, Any], dict[str, Any]]) -> None:
    stand_ins, out = seen
    assert _follows(stand_ins, out["serve"]) == SHARED | SERVE_ONLY
    assert _follows(stand_ins, out["worker"]) == SHARED
    assert out["check-config"]["timeout_s"] == stand_ins["CHECK_TIMEOUT_S"]


@pytest.mark.parametrize("source", ["cli-model", "models-file", "router-config"])
def test_every_way_to_name_a_model_reads_the_same_defaults(
    seen: tuple[dict[str, Any], dict[str, Any]], source: str
) -> None:
    stand_ins, out = seen
    assert _follows(stand_ins, out[source]) == PLACEMENT | BATCHING | COALESCING


def test_the_app_and_the_queue_read_the_defaults(seen: tuple[dict[str, Any], dict[str, Any]]) -> None:
    stand_ins, out = seen
    server = _follows(stand_ins, out["server-settings"])
    # PLAN_THREADS has no flag: the planner's width is the replica's memory bound, not a knob.
    settings_only = {"BULK_CHUNK_SIZE", "PLAN_THREADS"}
    assert server == (SHARED | SERVE_ONLY | settings_only) - PLACEMENT - BATCHING - {"HOST", "PORT"}
    assert _follows(stand_ins, out["batch-limits"]) == BATCHING | COALESCING
    assert _follows(stand_ins, out["model-settings"]) == BATCHING | COALESCING
    assert out["check-endpoints-timeout"] == stand_ins["CHECK_TIMEOUT_S"]


def test_a_package_without_a_token_limit_falls_back_to_the_default(
    seen: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    stand_ins, out = seen
    assert out["layout-max-tokens"] == stand_ins["FALLBACK_MAX_TOKENS"]
    assert out["checkpoint-max-tokens"] == stand_ins["FALLBACK_MAX_TOKENS"]


def test_the_probe_sees_every_constant_it_replaces() -> None:
    # A constant added to defaults.py gets a stand-in too: none may be an unhandled kind.
    assert all(isinstance(getattr(defaults, n), int | float | str | type(None)) for n in NAMES)
