"""The small-batch path on onnxruntime: the dense forward exported once at load, run by ORT.

The graph is exported from the loaded module itself (so its numbers are the native ones up to
float rounding) into the graph cache or a private temporary folder, and opened once on the
forward threads' thread count; nothing the package ships is run. onnxruntime holds one extra
copy of the weights and reports it (`memory_bytes`).
"""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm_srun.engines.native import graph_cache
from vllm_srun.tuning import return_freed_memory

if TYPE_CHECKING:
    from vllm_srun.engines.native.encoder import EncoderModel


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


class OnnxSmallBatch:
    """An onnxruntime session over the small-batch forward of one loaded model; `hidden` runs it.

    `memory_bytes` is what building the session added to this process's resident memory (the
    export included), None where the platform does not say. The session's intra-op thread
    count is fixed at load (`threads`: the forward threads' count), whichever thread calls
    `hidden`: a session opened later would cost the request that meets it, and would not have
    passed the engine's probe.
    """

    def __init__(self, model: EncoderModel, threads: int, key: str | None = None) -> None:
        return_freed_memory()  # freed memory out of the RSS measured around the session
        before = _resident_bytes()
        self.threads = threads
        # Whether the graph came from the cache as it was (graph_cache), not from an export here.
        self.from_cache = False
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self.session: Any = self._open_cached(key) if key is not None else None
        if self.session is None:
            self.session = _open(self._export(model, key), threads)
        # The exporter drops inputs the graph does not read (token types, for most models).
        self.inputs = {i.name for i in self.session.get_inputs()}
        return_freed_memory()  # and the export's freed temporaries
        after = _resident_bytes()
        self.memory_bytes = None if before is None or after is None else max(0, after - before)

    def _open_cached(self, key: str) -> Any:
        """A session over the graph the cache keeps under `key`; None when there is none, or
        when it does not open (a damaged entry, dropped so that it is exported afresh)."""
        path = graph_cache.cached_graph(key)
        if path is None:
            return None
        try:
            session = _open(str(path), self.threads)
        except Exception:
            graph_cache.drop_graph(key)
            return None
        self.from_cache = True
        return session

    def _export(self, model: EncoderModel, key: str | None) -> str:
        """Export `model` into the cache under `key`, else into a private temporary folder kept
        for the session's life (the graph's weights are a file beside it); the graph's path."""
        if key is not None:
            stored = graph_cache.store_graph(
                key, lambda folder: _export(model, str(folder / graph_cache.GRAPH_FILE))
            )
            if stored is not None:
                return str(stored)
        self._folder = tempfile.TemporaryDirectory(prefix="vllm-srun-onnx-")
        path = str(Path(self._folder.name) / graph_cache.GRAPH_FILE)
        _export(model, path)
        return path

    def hidden(self, ids: np.ndarray, types: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Hidden states [rows, width, hidden] of right-padded int64 `ids`, `types`, `valid`."""
        feed = {"input_ids": ids, "token_type_ids": types, "attention_mask": valid}
        (out,) = self.session.run(["hidden"], {k: v for k, v in feed.items() if k in self.inputs})
        return np.asarray(out)


def _open(path: str, threads: int) -> Any:
    """An onnxruntime session over the graph at `path`, on `threads` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle pool threads sleep rather than spin, as torch's do here (see vllm_srun.tuning):
    # a spinning pool starves the event loop and Redis on a busy machine.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return _at_forward_priority(
        lambda: ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    )


def _export(model: EncoderModel, path: str) -> None:
    """Export `model`'s forward on a padded block to `path`, its weights in a file beside it.

    Through files rather than bytes in memory, and with the weights as external data: the
    in-memory graph would be a second transient copy of the weights that stays in this
    process's heap, and onnxruntime reads external initializers straight from their file where
    it would otherwise hold the parsed graph's copy next to its own.
    """
    import onnx
    import torch

    from vllm_srun.engines.native.attention import Block
    from vllm_srun.engines.native.packed import plain_linears

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, types: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            rows, width = ids.shape
            block = Block.traced(valid)
            hidden = self.model(ids.reshape(-1), types.reshape(-1), block)
            return hidden.view(rows, width, -1)

    example = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "rows", 1: "width"}
    # The legacy (TorchScript) exporter: one self-contained graph, no extra dependencies.
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(), plain_linears(model):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Graph().eval(),
            (example, torch.zeros_like(example), example),
            path,
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["hidden"],
            dynamic_axes={
                "input_ids": axes,
                "token_type_ids": axes,
                "attention_mask": axes,
                "hidden": axes,
            },
            opset_version=17,
            dynamo=False,
        )
    graph = onnx.load(path)
    onnx.save_model(graph, path, save_as_external_data=True, location="weights.bin", size_threshold=1024)
    del graph


def _at_forward_priority(build: Callable[[], Any]) -> Any:
    """`build()` run in a helper thread at the forward threads' priority, so the intra-op pool
    threads onnxruntime starts for the session inherit it (a thread's nice value is its own on
    Linux, passed on to the threads it starts), as torch's OpenMP threads do from the forward
    thread (vllm_srun.tuning). A caller already below the process's priority (the forward
    thread itself) passes its own on unchanged."""
    from vllm_srun.tuning import lower_forward_priority

    lowered = False
    if hasattr(os, "getpriority"):
        try:
            mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            lowered = mine > os.getpriority(os.PRIO_PROCESS, os.getpid())
        except OSError:
            lowered = True  # cannot tell: leave the priority alone
    out: dict[str, Any] = {}

    def run() -> None:
        if not lowered:
            lower_forward_priority()
        try:
            out["value"] = build()
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc

    helper = threading.Thread(target=run, name="onnx-session")
    helper.start()
    helper.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux's /proc), None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
