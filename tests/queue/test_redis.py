"""queue/redis.py's pure parts: reading a cluster's replies."""

from __future__ import annotations

import pytest

from vllm_srun.queue.redis import _cluster_info, _node_addresses


def test_node_addresses_from_a_cluster_nodes_reply() -> None:
    text = (
        "07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460\n"
        "67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922\n"
        "e7d1 10.0.0.7:30004@40004 slave 07c3 0 1426238317239 4 connected\n"
    )
    expected = [("127.0.0.1", 30001), ("127.0.0.1", 30002), ("10.0.0.7", 30004)]
    assert _node_addresses(text) == expected
    assert _node_addresses(text.encode()) == expected
    # redis-py parses the reply into a dict keyed by address.
    assert _node_addresses({"127.0.0.1:30001@40001": {}, b"127.0.0.1:30002": {}}) == expected[:2]


def test_cluster_info_from_text_or_dict() -> None:
    text = "cluster_state:fail\r\ncluster_slots_assigned:0\r\n"
    assert _cluster_info(text) == {"cluster_state": "fail", "cluster_slots_assigned": "0"}
    assert _cluster_info({"cluster_state": "ok"}) == {"cluster_state": "ok"}


def test_a_transport_closed_under_a_command_is_a_lost_connection() -> None:
    """uvloop's RuntimeError on a write to a closed transport (a killed master) counts as
    Redis lost, as ConnectionError does; any other RuntimeError does not."""
    from vllm_srun.queue.redis import lost_connection

    closed = RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
    assert lost_connection(closed)
    assert lost_connection(ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."))
    assert not lost_connection(RuntimeError("a bug"))
    assert not lost_connection(ValueError("handler is closed"))


async def test_a_stream_closed_under_a_command_inside_redis_py_is_a_lost_connection() -> None:
    """redis-py's cluster client closes every connection of a node it gave up on, those another
    task is using too: that task's command meets a stream that is None, an AttributeError raised
    in redis-py's connection module. That counts as Redis lost; the same error from elsewhere
    is a bug."""
    from redis.asyncio.connection import Connection

    from vllm_srun.queue.redis import lost_connection

    closed = Connection(host="127.0.0.1", port=1)  # never connected: its stream is None
    with pytest.raises(AttributeError) as raised:
        await closed._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
    assert lost_connection(raised.value)
    try:
        None.writelines([])  # type: ignore[attr-defined]
    except AttributeError as ours:
        assert not lost_connection(ours)


async def test_a_chunk_whose_redis_closed_under_it_runs_again() -> None:
    """A worker's job that fails on a transport closed under it is run again once Redis is back,
    not finished as failed (which left a bulk job's lines of that chunk unstored for good)."""
    from types import SimpleNamespace

    from vllm_srun.queue.worker.device_worker import DeviceWorker

    calls = []

    async def attempt() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(
                "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
            )
        return 7

    worker = SimpleNamespace(_closing=False)
    assert await DeviceWorker._through_outage(worker, attempt, {"job_id": "j"}) == 7  # type: ignore[arg-type]
    assert len(calls) == 2

    async def bug() -> int:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match=r"^a bug$"):  # raised at once, not retried
        await DeviceWorker._through_outage(worker, bug, {"job_id": "j"})  # type: ignore[arg-type]


def test_redis_lost_under_a_command_is_a_503_and_nothing_else_is() -> None:
    from vllm_srun.errors import Unavailable
    from vllm_srun.queue.redis import unavailable_when_lost

    # What uvloop raises when redis-py writes to a connection reset under it.
    with pytest.raises(Unavailable, match="handler is closed"), unavailable_when_lost():
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
    with pytest.raises(RuntimeError, match="a bug"), unavailable_when_lost():
        raise RuntimeError("a bug")
