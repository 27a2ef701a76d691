"""queue/redis.py's pure parts: reading a cluster's replies."""

from __future__ import annotations

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
