"""Cache keys and Redis key names are pure functions of what changes a result."""

from __future__ import annotations

from vllm_srun.queue import keys

BASE = {"model_sha256": "a" * 64, "numerics": "float32", "key_extra": "logits", "token_ids": [1, 2, 3]}


def test_same_work_same_key() -> None:
    assert keys.cache_key(**BASE) == keys.cache_key(**dict(BASE))
    assert len(keys.cache_key(**BASE)) == 64


def test_every_field_changes_the_key() -> None:
    base = keys.cache_key(**BASE)
    for field, value in [
        ("model_sha256", "b" * 64),
        ("numerics", "approximate:bfloat16"),
        ("key_extra", "mean"),
        ("token_ids", [1, 2, 4]),
    ]:
        assert keys.cache_key(**{**BASE, field: value}) != base, field
    assert keys.cache_key(**BASE, type_ids=[0, 0, 1]) != base


def test_fields_cannot_run_into_each_other() -> None:
    one = keys.cache_key(model_sha256="ab", numerics="c", key_extra="", token_ids=[])
    two = keys.cache_key(model_sha256="a", numerics="bc", key_extra="", token_ids=[])
    assert one != two


def test_key_names_share_a_prefix_per_deployment() -> None:
    name = "my model:v1"
    for key in (
        keys.queue_name(name),
        keys.wake_channel(name),
        keys.bulk_wake_channel(name),
        keys.result_key(name, "k"),
        keys.worker_key(name),
    ):
        assert key.startswith("vllm_srun:") and " " not in key and "my_model_v1" in key
    assert keys.queue_name("a") != keys.bulk_queue_name("a")
    assert keys.wake_channel("a") != keys.bulk_wake_channel("a")


def test_a_salt_parts_the_cache_and_no_salt_is_the_old_key() -> None:
    unsalted = keys.cache_key(**BASE)
    assert keys.cache_key(**BASE, salt="") == unsalted  # one key or none: entries stay shared
    one, two = keys.cache_salt("key-one"), keys.cache_salt("key-two")
    assert one != two and len(one) == 64
    salted = {keys.cache_key(**BASE, salt=s) for s in (one, two)}
    assert len(salted) == 2 and unsalted not in salted
    # The salt is its own field: it cannot stand in for type ids or run into them.
    assert keys.cache_key(**BASE, type_ids=[0], salt=one) != keys.cache_key(**BASE, salt=one)


def test_a_caller_is_a_digest_never_the_key() -> None:
    key = "sk-secret-value"
    owner, salt = keys.caller_id(key), keys.cache_salt(key)
    assert key not in owner and key not in salt and owner != salt
    assert keys.caller_id(key) == owner and keys.caller_id(key + "x") != owner


def test_idempotency_keys_are_per_caller() -> None:
    a, b = keys.caller_id("a"), keys.caller_id("b")
    assert keys.idempotency_key("m", "k", a) != keys.idempotency_key("m", "k", b)
    assert keys.idempotency_key("m", "k") == keys.idempotency_key("m", "k", "")
    assert a in keys.idempotency_key("m", "k", a)


def test_what_one_script_touches_shares_a_hash_tag() -> None:
    """Redis Cluster hashes only a key's tag: a model's queue, leases, workers and every arq key
    of its jobs share one; bulk state shares another; cache entries carry none."""
    from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

    name = "my model:v1"
    job_id = keys.arq_job_id(name)
    assert job_id != keys.arq_job_id(name)
    model = {
        keys.queue_name(name),
        keys.bulk_queue_name(name),
        keys.lease_key(keys.queue_name(name)),
        keys.lease_key(keys.bulk_queue_name(name)),
        keys.worker_key(name),
        keys.engines_key(name),
        job_key_prefix + job_id,
        in_progress_key_prefix + job_id,
        retry_key_prefix + job_id,
        keys.crashes_key(job_id),
        keys.withdrawn_key(job_id),
        keys.isolation_key(job_id),
    }
    assert {keys.key_slot_tag(k) for k in model} == {"m:my_model_v1"}
    assert keys.key_slot_tag(keys.queue_name("other")) != "m:my_model_v1"
    bulk = {
        keys.job_key("job_1"),
        keys.job_requests_key("job_1"),
        keys.job_custom_ids_key("job_1"),
        keys.job_results_key("job_1"),
        keys.job_chunks_key("job_1"),
        keys.job_events_key("job_1"),
        keys.jobs_live_key(),
        keys.jobs_items_key(),
        keys.jobs_bytes_key(),
        keys.jobs_totals_key(),
        keys.idempotency_key(name, "k", "owner"),
    }
    assert {keys.key_slot_tag(k) for k in bulk} == {"jobs"}
    # No tag: a cache entry's slot is its whole key's, so entries spread over the cluster.
    entry = keys.result_key(name, "abc")
    assert "{" not in entry and keys.key_slot_tag(entry) == entry
    # A name with braces cannot open a tag of its own.
    assert keys.key_slot_tag(keys.queue_name("a}{b")) == "m:a__b"
