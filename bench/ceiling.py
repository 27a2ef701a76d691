"""The ceiling and the peer: the same texts without HTTP or a queue.

Ceiling: the model loaded in this process with its engine (`load_model(..., with_engine=True)`),
each batch planned, run and finished exactly as a worker and an app would (`plan_surface` →
`run(items)` → `finish_surface`), in input order, at the best of a few batch sizes. Its
single-text latency is the same call with one text. Peer: sentence-transformers `encode` at
batch 32 (it sorts by length itself), skipped with a reason when it is not installed or the
package is not a sentence-transformers model. Both use this process's torch threads, which
`bench.__main__` sets as `vllm-srun serve` sets its own (the same function).

On a shared machine the load drifts within seconds, so the ceiling's corpus pass and the peer
alternate segment by segment (SEGMENT texts each; `encode` sorts within a segment), and the
batch-size sweep runs its sizes in turn, twice, keeping each size's better round.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.corpus import warm_texts
from vllm_srun import defaults

SWEEP = (8, 16, 32, 64, 128)
PEER_BATCH = 32
SEGMENT = 256
SWEEP_TEXTS = 256


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_ms(seconds: list[float]) -> dict[str, float | None]:
    """p50/p95/p99 in milliseconds of a list of durations in seconds (None when empty)."""
    if not seconds:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    return {f"p{q}_ms": _pct(seconds, q / 100) * 1000 for q in (50, 95, 99)}


def torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_num_threads())


class Ceiling:
    """One model loaded in-process; `batch(texts)` is one plan → run → finish."""

    def __init__(self, model_path: str, dtype: str = defaults.DTYPE) -> None:
        from vllm_srun.plugins.discovery import load_plugins
        from vllm_srun.plugins.surfaces import EmbeddingsRequest
        from vllm_srun.registry.loader import ModelOptions, load_model

        self._request = EmbeddingsRequest
        self.model, self.placement = load_model(
            load_plugins(), ModelOptions(ref=model_path, dtype=dtype), with_engine=True
        )

    def batch(self, texts: list[str]) -> Any:
        plan = self.model.plan_surface("embeddings", self._request(input=texts))
        return self.model.finish_surface(plan, self.model.run(plan.items))

    def rate(self, texts: list[str], size: int, deadline: float) -> tuple[float, int]:
        """(texts/s, texts done) over `texts` in batches of `size`, stopping at `deadline`."""
        done, started = 0, time.perf_counter()
        for i in range(0, len(texts), size):
            if time.monotonic() > deadline:
                break
            chunk = texts[i : i + size]
            self.batch(chunk)
            done += len(chunk)
        seconds = time.perf_counter() - started
        return (done / seconds if seconds > 0 else 0.0), done

    def warm(self, count: int = 64) -> None:
        texts = warm_texts(count, round_=50)
        for size in (1, 8, 32, 64):
            self.batch(texts[:size])

    def sweep(self, sample: list[str], deadline: float, rounds: int = 2) -> dict[int, float]:
        """texts/s at each batch size of SWEEP on `sample`: the better of `rounds` rounds."""
        sizes = [size for size in SWEEP if size <= max(len(sample), 8)]
        best = dict.fromkeys(sizes, 0.0)
        for _ in range(rounds):
            for size in sizes:
                best[size] = max(best[size], self.rate(sample, size, deadline)[0])
        return best

    def single(self, texts: list[str], deadline: float) -> list[float]:
        """Seconds per one-text call, for each text until `deadline`."""
        out = []
        for text in texts:
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            self.batch([text])
            out.append(time.perf_counter() - started)
        return out


def run_ceiling(
    model_path: str,
    texts: list[str],
    single_texts: list[str],
    budget_s: float,
    *,
    peer: bool = True,
    dtype: str = defaults.DTYPE,
) -> tuple[Ceiling, dict[str, Any], dict[str, Any]]:
    """Load (in `dtype`: the server's), warm, sweep batch sizes on a
    sample, run the corpus at the best (alternating with the peer), then single texts. Returns
    the loaded ceiling too, for the passes next to each shape, and the peer's figures (or
    `{"skipped": reason}`)."""
    deadline = time.monotonic() + budget_s
    ceiling = Ceiling(model_path, dtype)
    ceiling.warm()
    sweep = ceiling.sweep(texts[: min(len(texts), SWEEP_TEXTS)], deadline)
    best = max(sweep, key=lambda size: sweep[size])
    encoder, skipped = load_peer(model_path) if peer else (None, "--no-peer")
    done, seconds, peer_seconds = 0, 0.0, 0.0
    deadline = time.monotonic() + 2 * budget_s  # the ceiling's share and the peer's
    for i in range(0, len(texts), SEGMENT):
        if time.monotonic() > deadline:
            break
        segment = texts[i : i + SEGMENT]
        started = time.perf_counter()
        ceiling.rate(segment, best, float("inf"))
        middle = time.perf_counter()
        if encoder is not None:
            encoder.encode(segment, batch_size=PEER_BATCH)
        done, seconds, peer_seconds = (
            done + len(segment),
            seconds + middle - started,
            peer_seconds + time.perf_counter() - middle,
        )
    rate = done / seconds if seconds else 0.0
    singles = ceiling.single(single_texts, time.monotonic() + budget_s)
    figures = {
        "placement": vars(ceiling.placement),
        "torch_threads": torch_threads(),
        "sweep_texts_per_s": {str(k): round(v, 1) for k, v in sweep.items()},
        "best_batch": best,
        "texts": done,
        "texts_per_s": rate,
        "passes_texts_per_s": [rate],
        "single_texts": len(singles),
        "single_texts_per_s": len(singles) / sum(singles) if singles else None,
        "single": latency_ms(singles),
        "single_passes_p50_ms": [latency_ms(singles)["p50_ms"]],
    }
    if encoder is None:
        return ceiling, figures, {"skipped": skipped}
    peer_figures = {
        "library": "sentence-transformers",
        "batch_size": PEER_BATCH,
        "texts": done,
        "texts_per_s": done / peer_seconds if peer_seconds else 0.0,
        "alternated_with_ceiling_segments_of": SEGMENT,
        "torch_threads": torch_threads(),
    }
    return ceiling, figures, peer_figures


def adjacent_pass(
    ceiling: Ceiling, result: dict[str, Any], texts: list[str], *, single: bool, budget_s: float
) -> float | None:
    """One more ceiling pass, run between server shapes (texts/s at the best batch size, or the
    single-text p50 in ms), recorded in `result`. A shape is compared with the passes just
    before and after it: on a shared machine the load drifts within minutes, and this keeps the
    ceiling and the server under the same drift."""
    deadline = time.monotonic() + budget_s
    if single:
        p50 = latency_ms(ceiling.single(texts, deadline))["p50_ms"]
        result["single_passes_p50_ms"].append(p50)
        return p50
    rate, _ = ceiling.rate(texts, result["best_batch"], deadline)
    result["passes_texts_per_s"].append(rate)
    return rate


def load_peer(model_path: str) -> tuple[Any, str]:
    """(a warmed sentence-transformers model, "") or (None, why there is none)."""
    root = Path(model_path)
    if not (root / "modules.json").is_file() and not (root / "config_sentence_transformers.json").is_file():
        return None, "not a sentence-transformers package (no modules.json)"
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None, "sentence-transformers is not installed (pip install '.[bench]')"
    model = SentenceTransformer(str(root), device="cpu")
    model.encode(warm_texts(64, round_=60), batch_size=PEER_BATCH)
    return model, ""
