"""`OnnxRuntimeEngine`: runs a package's ONNX graph with onnxruntime on the CPU.

onnxruntime is imported when a model loads, so this module (and `supports`) works without it.
One thread-safe `InferenceSession` per model. Rows get the output kind they ask for, pooled on
the host from the hidden state where needed (never normalised: the family's job); the output
heads a package declares run on the host too (outputs.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.engines.onnxruntime.graph import HIDDEN_KINDS, check_graph, check_inputs, output_kinds
from vllm_srun.engines.onnxruntime.outputs import (
    HEAD_OUTPUTS,
    SPLADE,
    Projections,
    host_heads,
    read_projections,
)
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import Batch, Device, Engine, EngineModel, ModelSpec


def _available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


@dataclass(frozen=True)
class OnnxHost:
    """What `read` prepares before the device is taken: the checked graph's bytes and the
    package's projection heads."""

    graph: bytes
    projections: Projections


class OnnxRuntimeEngine(Engine):
    """CPU inference of `spec.extra["onnx"]` graphs with onnxruntime's CPUExecutionProvider."""

    name = "onnxruntime"
    # Not chosen automatically: it pads every row to the longest in the batch, which costs more
    # than the native engine's packed rows once batches hold more than a few texts; name it to
    # use it.
    auto_priority = None
    dtypes = ("float32",)

    def supports(self, spec: ModelSpec, device: Device) -> str | None:
        if not _available():
            return "onnxruntime is not installed (pip install 'vllm-srun[onnx]')"
        if not spec.extra.get("onnx"):
            return "the package has no ONNX graph (onnx/model.onnx)"
        if device.accelerator != "cpu":
            return f"the onnxruntime engine runs on cpu only, not {device}"
        if spec.dtype not in self.dtypes:
            return f"dtype {spec.dtype!r} is not supported (supported: {', '.join(self.dtypes)})"
        return None

    def read(self, spec: ModelSpec, dtype: str) -> OnnxHost:
        """The graph's bytes, checked for custom operators and external data, and the tensors of
        the package's state dicts (torch.load with weights_only=True)."""
        if dtype not in self.dtypes:
            raise ConfigError(f"onnxruntime engine: dtype {dtype!r} is not supported (supported: float32)")
        path = Path(spec.extra["onnx"])
        data = path.read_bytes()
        check_graph(data, str(path))
        return OnnxHost(data, read_projections(spec))

    def load(self, spec: ModelSpec, device: Device, dtype: str, host: Any) -> OnnxEngineModel:
        reason = self.supports(spec, device)
        if reason is not None:
            raise ConfigError(f"onnxruntime engine cannot run {spec.architecture}: {reason}")
        read = host if isinstance(host, OnnxHost) else self.read(spec, dtype)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(read.graph, options, providers=["CPUExecutionProvider"])
        return OnnxEngineModel(
            session, spec, device, dtype, where=str(spec.extra["onnx"]), projections=read.projections
        )


# A masked-LM graph answers float32 logits [rows, width, vocab] for a whole run: a batch asking
# for SPLADE runs in slices of rows that keep them within this (a 30,522-word vocabulary at 512
# tokens is 62 MB a row; a 16k-token batch in one run would be 2 GB).
LOGITS_BYTES = 256 * 2**20


def _rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows [start, stop) of `batch` as a batch of their own."""
    lo, hi = int(batch.offsets[start]), int(batch.offsets[stop])
    return Batch(
        token_ids=batch.token_ids[lo:hi],
        offsets=batch.offsets[start : stop + 1] - lo,
        outputs=batch.outputs[start:stop],
        type_ids=None if batch.type_ids is None else batch.type_ids[lo:hi],
        key_lengths=None if batch.key_lengths is None else batch.key_lengths[start:stop],
    )


class OnnxEngineModel(EngineModel):
    """One session; batches are padded to their longest row."""

    def __init__(
        self,
        session: Any,
        spec: ModelSpec,
        device: Device,
        dtype: str,
        *,
        where: str,
        projections: Projections | None = None,
    ) -> None:
        self.session = session
        self.device = device
        self.dtype = dtype
        self.inputs = check_inputs((i.name for i in session.get_inputs()), where)
        outputs = session.get_outputs()
        self.kinds = output_kinds((o.name, len(o.shape)) for o in outputs)
        if not self.kinds:
            raise ConfigError(f"{where}: no ONNX output is logits or a hidden state")
        widths = {o.name: o.shape[-1] if o.shape else None for o in outputs}
        self.heads = host_heads(spec, self.kinds, widths, projections or Projections())
        self.pad_id = int(spec.config.get("pad_token_id") or 0)
        self.vocab = max(int(spec.config.get("vocab_size") or 1), 1)

    def output_refusal(self, output: str) -> str | None:
        try:
            self._output_of(output)
        except ValueError as exc:
            return f"the onnxruntime engine: {exc}"
        return None

    def _output_of(self, kind: str) -> str:
        """The graph output that rows of `kind` read; ValueError saying why there is none."""
        if "@" in kind:  # the native engine's early exits ("mean@3"): a graph gives its last layer
            raise ValueError(f"output {kind!r}: the onnxruntime engine cannot exit at an earlier layer")
        if kind in HEAD_OUTPUTS:
            if kind in self.heads.sources:
                return self.heads.sources[kind]
            reason = self.heads.refused.get(kind, "the package's head for it runs on the native engine only")
            raise ValueError(f"the ONNX graph cannot give output {kind!r}: {reason}")
        source = "hidden" if kind in HIDDEN_KINDS else kind
        if source not in self.kinds:
            raise ValueError(
                f"the ONNX graph cannot give output {kind!r}: it gives {', '.join(sorted(self.kinds))}"
            )
        return self.kinds[source]

    def _feed(self, batch: Batch) -> tuple[dict[str, np.ndarray], np.ndarray]:
        lengths = np.diff(batch.offsets)
        width = max(int(lengths.max()) if len(lengths) else 1, 1)
        mask = np.arange(width)[None, :] < lengths[:, None]
        ids = np.full(mask.shape, self.pad_id, dtype=np.int64)
        ids[mask] = batch.token_ids  # rows are packed back to back, in row-major order
        feed = {"input_ids": ids}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = mask.astype(np.int64)
        # Token type ids go exactly where the graph takes them: a graph without the input was
        # exported from a model that reads none (its reference ignores them too).
        if "token_type_ids" in self.inputs:
            types = np.zeros(mask.shape, dtype=np.int64)
            if batch.type_ids is not None:
                types[mask] = batch.type_ids
            feed["token_type_ids"] = types
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.broadcast_to(np.arange(width, dtype=np.int64), mask.shape).copy()
        return feed, lengths

    def _rows_per_run(self, batch: Batch) -> int:
        """How many rows one session run may take: all of them, unless the batch asks for the
        masked-LM logits, which the graph answers for every padded cell at once."""
        if SPLADE not in batch.outputs:
            return len(batch)
        width = int(np.diff(batch.offsets).max())
        return max(1, LOGITS_BYTES // (width * self.vocab * 4))

    def encode(self, batch: Batch) -> list[np.ndarray]:
        if len(batch) == 0:
            return []
        step = self._rows_per_run(batch)
        if step < len(batch):
            return [
                row
                for start in range(0, len(batch), step)
                for row in self.encode(_rows(batch, start, min(start + step, len(batch))))
            ]
        names = sorted({self._output_of(kind) for kind in batch.outputs})
        feed, lengths = self._feed(batch)
        if batch.key_lengths is not None and bool((batch.key_lengths < lengths).any()):
            # A graph's attention mask is its own to read (key mask, positions, pooling): tokens
            # that attend but are not keys cannot be said to it, and ignoring them is wrong numbers.
            raise ValueError("the onnxruntime engine cannot run tokens that are not attention keys")
        values = dict(zip(names, self.session.run(names, feed), strict=True))
        rows: list[np.ndarray] = []
        for i, kind in enumerate(batch.outputs):
            out = values[self._output_of(kind)]
            n = int(lengths[i])
            if kind in HEAD_OUTPUTS:
                row = self.heads.row(kind, out[i, :n])
            elif kind == "logits":
                row = out[i]
            elif kind in ("token_logits", "hidden"):
                row = out[i, :n]
            elif kind == "mean":
                row = out[i, :n].astype(np.float64).mean(axis=0)
            elif kind == "cls":
                row = out[i, 0]
            else:  # "last": the row's last real token, not a pad
                row = out[i, n - 1]
            # A copy, so a cached row does not keep the whole batch output alive.
            rows.append(np.array(row, dtype=np.float32, copy=True))
        return rows
