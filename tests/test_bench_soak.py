"""The soak's verdict (bench/soak.py `summarize`), from samples made up to cross each bound."""

from __future__ import annotations

import argparse

from bench.soak import Tally, summarize

ARGS = argparse.Namespace(duration_s=100.0, window_s=25.0)


def tally(*, app_growth: float = 1.0, redis_growth: float = 1.0, last_p99_s: float = 0.1) -> Tally:
    t = Tally()
    for step in range(0, 101, 2):
        grown = step >= 75  # the last window
        rss = {"app-0": 100e6 * (app_growth if grown else 1.0), "worker-0": 300e6, "redis-state": 5e6}
        used = 20e6 * (redis_growth if grown else 1.0)
        t.memory.append(
            {
                "t_s": float(step),
                "rss": rss,
                "redis_state": {"used_memory": used, "keys": 10},
                "redis_cache": {"used_memory": 3e6, "keys": 100},
            }
        )
        t.latencies += [(float(step), last_p99_s if grown else 0.1)] * 10
    return t


def test_a_flat_run_passes() -> None:
    summary = summarize(tally(), ARGS, 25.0, 10.0, 12.0)
    assert summary["failed_bounds"] == []
    assert summary["rss_growth_pct"]["app-0"] == 0.0 and len(summary["p99_ms"]) == 3


def test_each_bound_missed_is_named() -> None:
    summary = summarize(tally(app_growth=1.06, redis_growth=1.3, last_p99_s=0.13), ARGS, 25.0, 10.0, 12.0)
    assert summary["failed_bounds"] == [
        "rss_growth_pct[app-0]",
        "used_memory_growth_pct[state]",
        "p99_ms drift",
    ]
    # A small Redis growing past the percentage by less than the tombstones' slack passes.
    small = tally(redis_growth=1.3)
    for row in small.memory:
        row["redis_state"]["used_memory"] /= 10
    assert summarize(small, ARGS, 25.0, 10.0, 12.0)["failed_bounds"] == []
    lost = tally()
    lost.items_lost, lost.unexpected = 1, 2
    assert summarize(lost, ARGS, 25.0, 10.0, 12.0)["failed_bounds"] == ["lost", "unexpected_5xx"]
