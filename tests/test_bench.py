"""`python -m bench` end to end on the example keyword model with a tiny corpus: it prints one
table and writes JSON with every shape's figures, the ceiling and the replica's memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SHAPES = ("c1x1", "c32x1", "c4x64", "bulk_job", "cache")


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
        assert shape["errors"] == 0, (name, shape["first_error"])
        assert shape["texts"] == 64
        for figure in ("texts_per_s", "p50_ms", "p95_ms", "p99_ms", "ratio"):
            assert isinstance(shape[figure], float) and shape[figure] > 0, (name, figure)
    assert result["shapes"]["cache"]["hits"] > 0
    assert result["shapes"]["cache"]["hit_server_total"]["p50_ms"] > 0
    assert result["shapes"]["bulk_job"]["status"] == "completed"
    ceiling = result["ceiling"]
    assert ceiling["texts_per_s"] > 0 and ceiling["single"]["p50_ms"] > 0
    assert ceiling["best_batch"] in (8, 16, 32, 64, 128)
    assert "skipped" in result["peer"]  # the keyword model is no sentence-transformers package
    assert result["memory"]["server_peak_rss_mb"] > 0 and result["memory"]["replica_rss_mb"] > 0
    assert {t["name"] for t in result["targets"]} == {
        "c32x1",
        "c4x64",
        "bulk_job",
        "ceiling",
        "c1x1",
        "cache",
        "replica",
    }
    assert all(t["pass"] in (True, False, None) for t in result["targets"])
