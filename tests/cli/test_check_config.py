"""`check-config`: the endpoint check finds a deployment served under an alias."""

from __future__ import annotations

from vllm_srun.cli.check_config import _by_name, _judge
from vllm_srun.cli.router_config import CatalogDeployment


def test_the_endpoint_check_finds_a_deployment_served_under_an_alias() -> None:
    listed = [{"id": "all-MiniLM-L6-v2", "aliases": ["minilm"], "device": "cpu", "state": "ready"}]
    deployment = CatalogDeployment(name="d", model="minilm", endpoint="http://x", device="cpu")
    check = _judge(deployment, _by_name(listed))
    assert check.ok, check.detail
    missing = _judge(CatalogDeployment(name="d", model="other", endpoint="http://x"), _by_name(listed))
    assert not missing.ok and missing.detail.endswith("it serves: all-MiniLM-L6-v2 on cpu (ready)")
