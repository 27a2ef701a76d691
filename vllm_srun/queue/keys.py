"""Every Redis key, channel and cache key the runtime uses, and nothing else.

Keys are pure functions of their inputs, so two replicas, or a restarted one, name the same
thing the same way; each deployment's keys share one prefix. Hash tags keep what one script,
transaction or multi-key command touches in one Redis Cluster slot: a model's queues, leases,
workers and arq job keys carry `model_tag`; bulk-job state carries `JOBS_TAG`; result-cache
entries carry none, so they spread over every slot.
"""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from collections.abc import Sequence

PREFIX = "vllm_srun"

# arq's job function name for a batch of work items.
RUN_ITEMS = "run_items"

_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def deployment_slug(deployment: str) -> str:
    """A deployment name made safe to embed in a key (no spaces, colons or braces)."""
    return _SAFE.sub("_", deployment)


def model_tag(deployment: str) -> str:
    """The hash tag of everything one deployment's queue scripts touch (see the module doc)."""
    return "{m:" + deployment_slug(deployment) + "}"


def arq_job_id(deployment: str) -> str:
    """A fresh arq job id (an interactive job or a bulk chunk of `deployment`) that carries the
    model's tag, so every arq and lease key of the job shares the queue's slot."""
    return model_tag(deployment) + uuid.uuid4().hex


def queue_name(deployment: str) -> str:
    """arq queue (sorted set) of interactive jobs for one deployment."""
    return f"{PREFIX}:queue:{model_tag(deployment)}"


def bulk_queue_name(deployment: str) -> str:
    """arq queue of bulk-job chunks; workers take interactive work first."""
    return f"{PREFIX}:bulk:{model_tag(deployment)}"


def wake_channel(deployment: str) -> str:
    """Pub/sub channel that wakes a deployment's workers when a job is enqueued."""
    return f"{PREFIX}:wake:{deployment_slug(deployment)}"


def bulk_wake_channel(deployment: str) -> str:
    """Pub/sub channel that wakes a deployment's bulk pollers (a chunk queued or finished), so an
    interactive request wakes only the interactive poller."""
    return f"{PREFIX}:wake-bulk:{deployment_slug(deployment)}"


def reply_channel(app_id: str) -> str:
    """Pub/sub channel on which one app process hears its jobs complete."""
    return f"{PREFIX}:reply:{app_id}"


def result_key(deployment: str, cache_key: str) -> str:
    """Where one work item's result is cached."""
    return f"{PREFIX}:result:{deployment_slug(deployment)}:{cache_key}"


def worker_key(deployment: str) -> str:
    """Sorted set of live workers of a deployment, scored by heartbeat expiry (ms)."""
    return f"{PREFIX}:workers:{model_tag(deployment)}"


def engines_key(deployment: str) -> str:
    """Hash of what each worker's engine says of a deployment (worker id -> JSON), written with
    its heartbeat; only the fields of workers live in `worker_key` count."""
    return f"{PREFIX}:engines:{model_tag(deployment)}"


def cache_key(
    *,
    model_sha256: str,
    numerics: str,
    key_extra: str,
    token_ids: Sequence[int],
    type_ids: Sequence[int] | None = None,
    salt: str = "",
) -> str:
    """sha256(model_sha256 ‖ numerics ‖ surface options ‖ token ids [‖ type ids] [‖ salt]).

    Fields are length-prefixed so no two different inputs concatenate to the same bytes.
    Never a request id or a timestamp. `salt` (a caller's `cache_salt`, or "") parts one
    caller's cache from another's; without one the key is what it always was, so unsalted
    entries stay shared.
    """
    digest = hashlib.sha256()
    for text in (model_sha256, numerics, key_extra):
        raw = text.encode()
        digest.update(struct.pack("<I", len(raw)))
        digest.update(raw)
    digest.update(struct.pack("<I", len(token_ids)))
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if type_ids is not None:
        digest.update(b"T")
        digest.update(struct.pack(f"<{len(type_ids)}q", *type_ids))
    if salt:
        raw = salt.encode()
        digest.update(b"S" + struct.pack("<I", len(raw)) + raw)
    return digest.hexdigest()


# Callers (API keys). Redis holds only these digests of a key, never the key itself; each use
# has its own domain tag, so the owner named on a job is not the salt of its cache keys.


def caller_id(api_key: str) -> str:
    """Who a job belongs to: a digest of the API key that made it."""
    return hashlib.sha256(b"vllm_srun caller\0" + api_key.encode()).hexdigest()


def cache_salt(api_key: str) -> str:
    """The salt of one API key's cache keys (`cache_key(salt=...)`), when callers are apart."""
    return hashlib.sha256(b"vllm_srun cache salt\0" + api_key.encode()).hexdigest()


# Bulk jobs. One job's keys share the `job:<id>` stem so they expire and read together; all of
# bulk state shares JOBS_TAG (the chunk script counts a job's lines into the global totals).

RUN_CHUNK = "run_chunk"
JOBS_TAG = "{jobs}"


def job_key(job_id: str) -> str:
    """Hash: the job's status, counts, times and settings."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}"


def job_requests_key(job_id: str) -> str:
    """List: the job's surface requests, as JSON, in input order."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}:requests"


def job_custom_ids_key(job_id: str) -> str:
    """List: each request's custom_id ("" when none), in input order."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}:custom_ids"


def job_results_key(job_id: str) -> str:
    """Hash: input index -> that request's result line (JSON)."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}:results"


def job_chunks_key(job_id: str) -> str:
    """Set: indices of the chunks that have finished (a retried chunk is counted once)."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}:chunks"


def job_events_key(job_id: str) -> str:
    """Stream: progress and status events, and result events naming the index of a line stored
    in the results hash (one copy of each line), read by Server-Sent Events."""
    return f"{PREFIX}:{JOBS_TAG}:job:{job_id}:events"


# What every live job holds, for the global quotas (BulkQuotas): one key each, not per job.


def jobs_live_key() -> str:
    """Sorted set: job id -> when its data expires (the accounting below forgets it then)."""
    return f"{PREFIX}:{JOBS_TAG}:live"


def jobs_items_key() -> str:
    """Hash: job id -> its items not yet stored (queued or running)."""
    return f"{PREFIX}:{JOBS_TAG}:items"


def jobs_bytes_key() -> str:
    """Hash: job id -> bytes of the result lines it has stored."""
    return f"{PREFIX}:{JOBS_TAG}:bytes"


def jobs_totals_key() -> str:
    """Hash: `items` and `bytes`, the sums of the two hashes above over live jobs."""
    return f"{PREFIX}:{JOBS_TAG}:totals"


def idempotency_key(model: str, key: str, owner: str = "") -> str:
    """The job created for one Idempotency-Key (per model, and per caller: `owner` is a
    `caller_id`, "" where the server takes no key), so two callers' keys never meet."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    if owner:
        return f"{PREFIX}:{JOBS_TAG}:idem:{deployment_slug(model)}:{owner}:{digest}"
    return f"{PREFIX}:{JOBS_TAG}:idem:{deployment_slug(model)}:{digest}"


def cancel_channel(deployment: str) -> str:
    """Pub/sub channel on which apps ask workers to drop a request's queued items."""
    return f"{PREFIX}:cancel:{deployment_slug(deployment)}"


# The request ids withdrawn from an interactive job live under this prefix + its arq job id (the
# claim script builds the key).
WITHDRAWN_PREFIX = f"{PREFIX}:withdrawn:"


def withdrawn_key(job_id: str) -> str:
    """Set: the request ids withdrawn from one interactive job. A cancel message reaches only a
    worker that already runs the job; one that claims it later reads this with the job."""
    return WITHDRAWN_PREFIX + job_id


# Leases and crash recovery (queue/worker/leases.py).


def key_slot_tag(key: str) -> str:
    """What Redis Cluster hashes of `key`: its hash tag's content, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def lease_key(queue: str) -> str:
    """Sorted set of the jobs workers hold from one arq queue, scored by lease expiry (ms)."""
    return f"{queue}:leases"


# A job's crash count lives under this prefix + its arq job id (the lease scripts build the key).
CRASHES_PREFIX = f"{PREFIX}:crashes:"


def crashes_key(job_id: str) -> str:
    """Counter: how many times a lease on this arq job lapsed (its worker died or stalled)."""
    return CRASHES_PREFIX + job_id


def isolation_key(job_id: str) -> str:
    """Hash: per item of an isolated job, how many solo forwards of it started and never ended."""
    return f"{PREFIX}:isolated:{job_id}"


# OpenAI's Batch API (files and batches): records under JOBS_TAG, beside the jobs they run as,
# and one index per caller (`owner`, "" without API keys) that lists them newest last.


def file_key(file_id: str) -> str:
    """Hash: an uploaded (or a batch's output) file's metadata."""
    return f"{PREFIX}:{JOBS_TAG}:file:{file_id}"


def file_content_key(file_id: str) -> str:
    """String: an uploaded file's bytes."""
    return f"{PREFIX}:{JOBS_TAG}:file:{file_id}:content"


def files_index_key(owner: str) -> str:
    """Sorted set: a caller's file ids by creation time."""
    return f"{PREFIX}:{JOBS_TAG}:files:{owner}"


def batch_key(batch_id: str) -> str:
    """Hash: a batch's request, its job id, and what its validation or finalizing recorded."""
    return f"{PREFIX}:{JOBS_TAG}:batch:{batch_id}"


def batches_index_key(owner: str) -> str:
    """Sorted set: a caller's batch ids by creation time."""
    return f"{PREFIX}:{JOBS_TAG}:batches:{owner}"
