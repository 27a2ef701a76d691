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


def jobs_tally(leak_per_s: float = 0.0) -> Tally:
    """A run with a job every 2 s whose data (300 kB each) is all still kept at the end, as in
    any run shorter than the jobs' TTL plus the hour past it; `leak_per_s` bytes more per second
    of the run, owed to no job."""
    t = tally()
    t.job_created_s = [float(s) for s in range(1, 101, 2)]
    for row in t.memory:
        kept = sum(1 for made in t.job_created_s if made <= row["t_s"])
        row["redis_state"]["used_memory"] = 1e6 + 300e3 * kept + leak_per_s * row["t_s"] ** 2
    return t


def test_the_state_redis_is_bounded_per_kept_job() -> None:
    # Its used memory triples over the measured span, all of it jobs' data still kept: a pass.
    flat = summarize(jobs_tally(), ARGS, 25.0, 10.0, 12.0, keep_s=3640.0)
    assert flat["redis_used_memory_growth_pct"]["state"] > 25
    assert flat["redis_state_bytes_per_kept_job"]["growth_pct"] == 0.0
    assert flat["failed_bounds"] == []
    # Growing faster than the jobs it keeps: named.
    leak = summarize(jobs_tally(leak_per_s=2e3), ARGS, 25.0, 10.0, 12.0, keep_s=3640.0)
    assert leak["failed_bounds"] == ["used_memory_per_kept_job_growth_pct[state]"]
    # Past its keep time a job's data counts no more: the same bytes over fewer jobs fail.
    expired = summarize(jobs_tally(), ARGS, 25.0, 10.0, 12.0, keep_s=30.0)
    assert expired["failed_bounds"] == ["used_memory_per_kept_job_growth_pct[state]"]
