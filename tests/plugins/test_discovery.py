"""Entry-point discovery with real distributions on sys.path, run as `vllm-srun plugins`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import fake_distribution, run_cli

GOOD = """
from vllm_srun.plugins.base import Accelerator, Device
class Good(Accelerator):
    def available(self): return True
    def devices(self): return [Device("good")]
"""


def run_plugins(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli("plugins", "--json", env={"PYTHONPATH": str(path), **env}, timeout=60)


def test_third_party_plugin_is_discovered(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "acme-good", {"vllm_srun.accelerators": {"good": "acme_good:Good"}}, GOOD)
    result = run_plugins(tmp_path)
    assert result.returncode == 0, result.stderr
    accelerators = {p["name"]: p for p in json.loads(result.stdout)["accelerators"]}
    assert accelerators["good"]["distribution"] == "acme-good"
    assert accelerators["good"]["version"] == "1.2.3"
    assert "cpu" in accelerators


def test_a_name_two_distributions_claim_refuses_the_start(tmp_path: Path) -> None:
    eps = {"vllm_srun.accelerators": {"cpu": "acme_clash:Good"}}
    fake_distribution(tmp_path, "acme-clash", eps, GOOD)
    result = run_plugins(tmp_path)
    assert result.returncode == 2
    assert "'cpu'" in result.stderr and "acme-clash" in result.stderr and "vllm-srun" in result.stderr


def test_wrong_base_class_is_refused(tmp_path: Path) -> None:
    code = "class NotAnEngine:\n    pass\n"
    fake_distribution(
        tmp_path, "acme-wrong", {"vllm_srun.engines": {"wrong": "acme_wrong:NotAnEngine"}}, code
    )
    result = run_plugins(tmp_path)
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert "wrong" not in {p["name"] for p in described["engines"]}
    refused = {r["name"]: r for r in described["refused"]}
    assert "not a subclass of vllm_srun.plugins.base.Engine" in refused["wrong"]["reason"]


def test_broken_plugin_is_logged_and_skipped(tmp_path: Path) -> None:
    code = "raise ImportError('needs libfoo')\n"
    fake_distribution(tmp_path, "acme-broken", {"vllm_srun.families": {"broken": "acme_broken:Family"}}, code)
    fake_distribution(tmp_path, "acme-good", {"vllm_srun.accelerators": {"good": "acme_good:Good"}}, GOOD)
    result = run_plugins(tmp_path)
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert "good" in {p["name"] for p in described["accelerators"]}
    refused = {r["name"]: r for r in described["refused"]}
    assert "needs libfoo" in refused["broken"]["reason"]
    assert "plugin_skipped" in result.stderr and "needs libfoo" in result.stderr


def test_allow_list_loads_only_named_plugins(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "acme-good", {"vllm_srun.accelerators": {"good": "acme_good:Good"}}, GOOD)
    result = run_plugins(tmp_path, VLLM_SRUN_PLUGINS="good,prometheus")
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert [p["name"] for p in described["accelerators"]] == ["good"]
    assert [p["name"] for p in described["stat_loggers"]] == ["prometheus"]
    assert described["families"] == [] and described["engines"] == []


def test_loading_is_idempotent() -> None:
    from vllm_srun.plugins.discovery import load_plugins

    first = load_plugins()
    assert load_plugins() is first
    again = load_plugins(reload=True)
    assert sorted(again.of("accelerators")) == sorted(first.of("accelerators"))
