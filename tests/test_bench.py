"""`python -m bench` end to end on the example keyword model with a tiny corpus: it prints one
table and writes JSON with every shape's figures, the ceiling and the replica's memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SHAPES = ("c1x1", "c32x1", "c4x64", "bulk_job", "cache", "lone_miss")


def test_bench_runs_every_shape(keywords: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    args = ["--model", str(keywords), "--texts", "64", "--out", str(out), "--shape-timeout-s", "60"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "c32 x 1 text" in done.stdout and "ceiling" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["shapes"]) == set(SHAPES)
    for name, shape in result["shapes"].items():
        assert shape["errors"] == 0, (name, shape.get("first_error"))
        if name == "lone_miss":  # its own figures (bench/lone_miss.py), not a closed loop's
            continue
        assert shape["texts"] == 64
        for figure in ("texts_per_s", "p50_ms", "p95_ms", "p99_ms", "ratio"):
            assert isinstance(shape[figure], float) and shape[figure] > 0, (name, figure)
    assert result["shapes"]["cache"]["hits"] > 0
    assert result["shapes"]["c32x1"]["loop_cpu_ms_per_request"] > 0
    assert result["shapes"]["cache"]["hit_server_total"]["p50_ms"] > 0
    assert result["shapes"]["bulk_job"]["status"] == "completed"
    ceiling = result["ceiling"]
    assert ceiling["texts_per_s"] > 0 and ceiling["single"]["p50_ms"] > 0
    assert ceiling["best_batch"] in (8, 16, 32, 64, 128)
    assert "skipped" in result["peer"]  # the keyword model is no sentence-transformers package
    # Without a peer's venv its columns are skipped, and the table says how to enable them.
    assert "skipped" in result["infinity"] and "--infinity-create" in done.stdout
    assert "skipped" in result["vllm"] and "--vllm-create" in done.stdout  # so are vLLM's
    assert result["memory"]["server_peak_rss_mb"] > 0 and result["memory"]["replica_rss_mb"] > 0
    assert {t["name"] for t in result["targets"]} == {
        "c32x1",
        "c4x64",
        "bulk_job",
        "ceiling",
        "c1x1",
        "cache",
        "lone_miss",
        "replica",
    }
    assert all(t["pass"] in (True, False, None) for t in result["targets"])


def _shape(texts_per_s: float, p50_ms: float, **extra: object) -> dict[str, object]:
    return {
        "texts": 64,
        "texts_per_s": texts_per_s,
        "p50_ms": p50_ms,
        "p95_ms": p50_ms * 2,
        "p99_ms": p50_ms * 3,
        "errors": 0,
        "server_total_p50_ms": None,
        "seconds": 1.0,
        "client_cpu_s": 0.1,
        **extra,
    }


def _result(infinity: dict[str, object]) -> dict[str, object]:
    return {
        "meta": {},
        "ceiling": {"texts_per_s": 100.0, "passes_texts_per_s": [100.0], "single": {"p50_ms": 8.0}},
        "peer": {"skipped": "no"},
        "shapes": {
            "c1x1": _shape(50.0, 10.0, ceiling_texts_per_s=100.0, ceiling_single_p50_ms=8.0),
            "c32x1": _shape(90.0, 300.0, ceiling_texts_per_s=100.0),
            "bulk_job": _shape(95.0, 600.0, ceiling_texts_per_s=100.0),
        },
        "infinity": infinity,
    }


def test_report_infinity_columns() -> None:
    """vllm-srun ÷ Infinity on each shape both ran, Infinity's own rows and ratio to the ceiling;
    a shape Infinity did not run (or failed) has no ratio, and a failure is shown, not hidden."""
    from bench import report

    result = _result(
        {
            "version": "0.0.77",
            "device": "cpu",
            "batch_size": 32,
            "threads": 2,
            "shapes": {
                "c1x1": _shape(40.0, 16.0),
                "c32x1": _shape(60.0, 500.0),
                "c4x64": {"error": "RuntimeError: server exited with 1"},
            },
        }
    )
    report.add_ratios(result)
    report.add_peer_ratios(result)
    shapes, peers = result["shapes"], result["infinity"]["shapes"]  # type: ignore[index]
    assert shapes["c32x1"]["over_infinity"] == 1.5
    assert shapes["c1x1"]["over_infinity"] == 1.25
    assert shapes["c1x1"]["p50_minus_infinity_ms"] == -6.0
    assert "over_infinity" not in shapes["bulk_job"]
    assert peers["c32x1"]["ratio"] == 0.6  # its texts/s over the ceiling around vllm-srun's c32x1
    assert peers["c1x1"]["ratio"] == 0.5  # the ceiling's single p50 over its p50
    result["targets"] = report.targets(result)
    lines = report.table(result).splitlines()
    assert lines[0].split()[-4:] == ["ratio", "/inf", "/vllm", "target"]
    c32 = next(line for line in lines if line.startswith("c32 x 1 text"))
    assert c32.split()[4:12] == ["64", "90.0", "300.0", "600.0", "900.0", "0", "0.90", "1.50"]
    inf = next(line for line in lines if line.startswith("inf c32 x 1 text"))
    assert inf.split()[5:] == ["64", "60.0", "500.0", "1000.0", "1500.0", "0", "0.60"]
    assert any(line.startswith("inf c4 x 64 texts") and "failed: RuntimeError" in line for line in lines)
    assert any("infinity-emb 0.0.77 (torch engine, cpu, batch size 32, 2 threads)" in line for line in lines)
    assert "c1: p50 minus Infinity's c1 p50: -6.00 ms" in lines


def test_report_infinity_skipped() -> None:
    from bench import report

    result = _result({"skipped": "no Infinity venv: run with --infinity-create"})
    report.add_ratios(result)
    report.add_peer_ratios(result)
    assert all("over_infinity" not in shape for shape in result["shapes"].values())  # type: ignore[attr-defined]
    result["targets"] = report.targets(result)
    table = report.table(result)
    assert "infinity          skipped: no Infinity venv: run with --infinity-create" in table


def test_the_ceiling_loads_the_dtype_the_server_is_given() -> None:
    from bench.__main__ import served_dtype

    assert served_dtype([]) == "auto"
    assert served_dtype(["--max-num-seqs", "16", "--dtype", "bfloat16"]) == "bfloat16"
    assert served_dtype(["--dtype=int8", "--dtype", "bfloat16"]) == "bfloat16"  # the last one wins


def test_linear_bound_counts_the_linears_and_measures_both_sides(tmp_path: Path) -> None:
    """`python -m bench.linear_bound` on the packaged MiniLM, tiny: its multiply-adds per token
    are MiniLM's six layers of q/k/v, output and MLP (384 wide, 1,536 inside), and the bound is
    the measured linear rate over them."""
    from helpers import minilm_dir

    from bench.corpus import corpus
    from bench.native_forward import tokenize

    out = tmp_path / "bound.json"
    args = ["--texts", "16", "--batch", "8", "--rounds", "1", "--dtypes", "float32", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.linear_bound", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["linear_macs_per_token"] == 6 * (384 * 3 * 384 + 384 * 384 + 2 * 384 * 1536)
    rows = tokenize(minilm_dir(), corpus(16))
    assert result["tokens_per_text"] == sum(map(len, rows)) / 16
    row = result["dtypes"]["float32"]
    per_text = result["linear_macs_per_token"] * result["tokens_per_text"]
    assert row["bound_texts_per_s"] == row["linear_gmacs"] * 1e9 / per_text
    assert row["forward_texts_per_s"] > 0
    assert "| float32 |" in done.stdout
