"""The small-batch ONNX graph is exported once per model and reused by later loads: a load that
finds its key opens the kept graph without exporting (torch.onnx is never imported), answers
the same numbers, and a kept graph that is damaged or no longer reproduces the module is
dropped and exported afresh, never served."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from vllm_srun.engines.native import graph_cache  # noqa: E402

LOAD = """
import json, sys
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.loader import ModelOptions, load_model
from vllm_srun.plugins.base import Batch, WorkItem

model, placement = load_model(load_plugins(), ModelOptions(ref=sys.argv[1]), with_engine=True)
native = model.engine_model
batch = Batch.from_items([WorkItem(token_ids=[5, 6, 7, 8, 9], output="hidden")])
(hidden,) = native.encode(batch, path="onnx")
print(json.dumps({
    "paths": list(native.paths),
    "from_cache": native._onnx.from_cache,
    "exporter_imported": "torch.onnx" in sys.modules,
    "hidden": hidden.tolist(),
}))
"""


def load_in_fresh_process(package: Path, cache: Path | str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(package)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, graph_cache.CACHE_ENV: str(cache)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def entries(cache: Path) -> list[Path]:
    folder = cache / "small-batch-onnx"
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def load_here(package: Path, cache: Path | str, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, np.ndarray]:
    """Load `package` in this process with the cache at `cache`: whether its small-batch graph
    came from the cache, and its hidden states of a few tokens on that graph."""
    from vllm_srun.plugins.base import Batch, WorkItem
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.loader import ModelOptions, load_model

    monkeypatch.setenv(graph_cache.CACHE_ENV, str(cache))
    model, _ = load_model(load_plugins(), ModelOptions(ref=str(package)), with_engine=True)
    native = model.engine_model
    assert native.paths[-1] == "onnx", native.paths
    batch = Batch.from_items([WorkItem(token_ids=[5, 6, 7, 8, 9], output="hidden")])
    (hidden,) = native.encode(batch, path="onnx")
    return native._onnx.from_cache, hidden


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    return write_fixture(tmp_path_factory.mktemp("graph-cache") / "emb", variant="bert-embedding")


def test_a_second_load_opens_the_kept_graph_without_exporting(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_cache, hidden = load_here(package, tmp_path, monkeypatch)
    assert not from_cache
    (entry,) = entries(tmp_path)
    assert (entry / graph_cache.GRAPH_FILE).is_file()
    assert (tmp_path / "small-batch-onnx").stat().st_mode & 0o077 == 0, "the cache is private to its user"

    second = load_in_fresh_process(package, tmp_path)
    assert second["from_cache"] and not second["exporter_imported"], second
    assert entries(tmp_path) == [entry]
    # The same graph, so the same numbers, bit for bit.
    assert np.array_equal(np.array(second["hidden"], dtype=np.float32), hidden)


def perturbed_copy(package: Path, out: Path) -> Path:
    """`package` with one weight matrix changed: another model of the same shape."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(package, out)
    tensors = load_file(out / "model.safetensors")
    name = next(n for n in sorted(tensors) if n.endswith("dense.weight"))
    tensors[name] = -tensors[name]  # not a shift: the layer norm after it would take that away
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_other_weights_are_kept_under_another_key(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_here(package, tmp_path, monkeypatch)
    from_cache, _ = load_here(perturbed_copy(package, tmp_path / "changed"), tmp_path, monkeypatch)
    assert not from_cache, "another model's graph was served"
    assert len(entries(tmp_path)) == 2


def test_a_damaged_graph_is_exported_afresh(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_here(package, tmp_path, monkeypatch)
    (entry,) = entries(tmp_path)
    (entry / graph_cache.GRAPH_FILE).write_bytes(b"not a graph")
    assert not load_here(package, tmp_path, monkeypatch)[0]
    assert load_here(package, tmp_path, monkeypatch)[0], "the fresh export was kept"


def test_a_kept_graph_that_differs_from_the_module_is_never_served(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another model's graph under this model's key (as a stale entry would be) fails the
    engine's probe: dropped, exported afresh, and the answer is this model's."""
    _, reference = load_here(package, tmp_path / "clean", monkeypatch)
    _, other = load_here(perturbed_copy(package, tmp_path / "other"), tmp_path / "other-cache", monkeypatch)
    assert not np.allclose(other, reference, atol=1e-3)
    (mine,) = entries(tmp_path / "clean")
    (theirs,) = entries(tmp_path / "other-cache")
    for file in theirs.iterdir():
        (mine / file.name).write_bytes(file.read_bytes())
    from_cache, got = load_here(package, tmp_path / "clean", monkeypatch)
    assert not from_cache
    # The probe's own bound (PROBE_ATOL) is what separates the two: a fresh export of the same
    # module reproduces it to float32 rounding.
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    assert load_here(package, tmp_path / "clean", monkeypatch)[0], "the fresh export replaced the stale one"


def test_the_cache_off_or_unwritable_exports_into_a_private_folder(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_cache, off = load_here(package, "off", monkeypatch)
    assert not from_cache
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where the cache folder would be")
    from_cache, got = load_here(package, blocked, monkeypatch)
    assert not from_cache
    # Two exports of one module on one thread count: the same graph and the same float32
    # arithmetic, so the same answers; 1e-6 leaves float32 rounding of values of order 1.
    np.testing.assert_allclose(got, off, atol=1e-6, rtol=0)


def test_a_cache_folder_others_can_write_is_never_used(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph planted in a folder that is not this user's alone is not opened, nor is one kept
    there: the load exports into a private folder as with no cache."""
    load_here(package, tmp_path, monkeypatch)
    (entry,) = entries(tmp_path)
    (tmp_path / "small-batch-onnx").chmod(0o777)
    from_cache, _ = load_here(package, tmp_path, monkeypatch)
    assert not from_cache
    assert entries(tmp_path) == [entry]


def test_a_graph_that_fails_the_probe_is_not_kept(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export that the engine's probe refuses leaves no entry for the next start to fail on."""
    from vllm_srun.engines.native import engine

    monkeypatch.setattr(engine, "PROBE_ATOL", -1.0)  # no graph can pass
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.loader import ModelOptions, load_model

    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path))
    model, _ = load_model(load_plugins(), ModelOptions(ref=str(package)), with_engine=True)
    assert model.engine_model.paths[-1] != "onnx"
    assert entries(tmp_path) == []


def test_a_store_removes_entries_unused_for_the_period_and_dead_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries opened within UNUSED_S stay, older ones go as another is stored, and so does a
    staging folder a killed export left; opening an entry renews it."""
    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path))
    root = tmp_path / "small-batch-onnx"
    root.mkdir(mode=0o700)
    now = time.time()

    def entry(name: str, idle_s: float) -> Path:
        folder = root / name
        folder.mkdir()
        (folder / graph_cache.GRAPH_FILE).write_bytes(b"graph")
        os.utime(folder, (now - idle_s, now - idle_s))
        return folder

    old = entry("old", graph_cache.UNUSED_S + 60)
    recent = entry("recent", graph_cache.UNUSED_S - 3600)
    reopened = entry("reopened", graph_cache.UNUSED_S + 60)
    dead = entry(graph_cache.STAGING_PREFIX + "dead", graph_cache.STALE_EXPORT_S + 60)
    busy = entry(graph_cache.STAGING_PREFIX + "busy", 5)
    assert graph_cache.cached_graph("reopened") == reopened / graph_cache.GRAPH_FILE  # renews it

    stored = graph_cache.store_graph("new", lambda folder: (folder / graph_cache.GRAPH_FILE).write_bytes(b"g"))

    assert stored == root / "new" / graph_cache.GRAPH_FILE
    assert not old.exists() and not dead.exists()
    assert recent.is_dir() and reopened.is_dir() and busy.is_dir()
