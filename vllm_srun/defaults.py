"""Every default setting, defined once.

The command line, `--models` files, router configs, the app, the worker and the queue classes
read their defaults from here, so a default changes in one place. This module imports nothing
of the project: any layer may read it.
"""

from __future__ import annotations

# Placement, per model (`--engine`, `--device`, `--dtype`): chosen by auto_priority and device.
ENGINE = "auto"
DEVICE = "auto"
DTYPE = "auto"

# Batching, per deployment (`--max-num-seqs`, `--max-num-batched-tokens`, `--batch-wait-ms`).
MAX_NUM_SEQS = 64
MAX_NUM_BATCHED_TOKENS = 16384
BATCH_WAIT_MS = 2.0
# A request of at most this many items to run is small: its items go into the next batch
# ahead of the queued items of larger requests (the coalescer's ordering).
SMALL_REQUEST_ITEMS = 8

# Where `serve` listens: this machine only, unless told otherwise.
HOST = "127.0.0.1"
PORT = 8000

# Requests.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_INPUTS = 2048
REQUEST_TIMEOUT_S = 60.0
# Most tasks one POST /v1/bundle carries (the upstream contract's `limits.max_bundle_tasks`);
# more is a 413 for the whole bundle, so a client splits its work to fit.
MAX_BUNDLE_TASKS = 64

# Surface requests one replica holds at once, from decoded body to response (TEI's
# --max-concurrent-requests, whose default this is); past it, 429 with Retry-After.
MAX_CONCURRENT_REQUESTS = 512
# Threads that tokenize and plan requests too large to plan on the event loop, per replica:
# bounded so that the memory of plans in progress is too (the rest wait their turn).
PLAN_THREADS = 2

# The version of the upstream runtime's contract (its OpenAPI `info.version`) this server
# speaks: /v1/models and /health report it, and a client refuses another major version.
API_VERSION = "2.3.0"

# A decisions `set` question selects the labels whose P(label holds) exceeds this, unless the
# question gives its own `threshold` (the applied one is reported in `thresholds`).
SET_THRESHOLD = 0.5

# Admission, per deployment and replica.
MAX_QUEUED_ITEMS = 100_000
MAX_QUEUED_TOKENS = 10_000_000

# Result cache: the shared Redis entries and this process's copy in front of them.
CACHE_TTL_S = 3600
LOCAL_CACHE_MB = 64

# Queue jobs and bulk jobs.
JOB_TIMEOUT_S = 300.0
JOB_TTL_S = 86400
# Sized so that one job's worst case fits an app replica's memory request: its lines are
# validated one at a time and kept as bytes (docs/bulk-jobs.md gives the measured cost).
MAX_JOB_REQUESTS = 100_000
MAX_JOB_BYTES = 64 * 1024 * 1024
BULK_CHUNK_SIZE = 256
# Job event streams (SSE) open at once per replica, and per caller (API key; keyless: client
# address); past either, 429 with Retry-After. Their Redis reads share a blocking pool of
# EVENT_STREAM_CONNECTIONS of their own (an idle stream holds one for its 2 s blocking read),
# and one read holds at most EVENT_BATCH_BYTES of result lines (at least one line).
MAX_EVENT_STREAMS = 128
MAX_EVENT_STREAMS_PER_CALLER = 16
EVENT_STREAM_CONNECTIONS = 64
EVENT_BATCH_BYTES = 256 * 1024

# Leases on the work a worker holds (interactive jobs and bulk chunks): renewed by the live
# worker every LEASE_RENEW_S, when it also puts back the work of leases not renewed for LEASE_S.
# A dead worker's work thus runs again within LEASE_S + LEASE_RENEW_S, while a forward of any
# length keeps its lease (the renewal runs on the event loop, not the forward thread).
LEASE_S = 5.0
LEASE_RENEW_S = 1.0
# Work whose worker process died this many times runs again one item per forward, so the item
# that kills workers is found and fails alone (`unavailable`); after MAX_CRASHES, whatever
# has no result yet fails without running again.
POISON_CRASHES = 2
MAX_CRASHES = 6

# CPU forwards: intra-op threads (None: one per core) and how much lower than the event loop
# the forward threads run (a nice increment; 0: the same).
INTRA_OP_THREADS: int | None = None
FORWARD_NICE = 10

# `check-config`: how long to wait for each endpoint's /v1/models.
CHECK_TIMEOUT_S = 5.0

# A model whose package states no token limit (no max_position_embeddings, no
# sentence-transformers max_seq_length) reads at most this many tokens: BERT's.
FALLBACK_MAX_TOKENS = 512
