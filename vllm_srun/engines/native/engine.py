"""The native engine: PyTorch modules from the architecture registry, run on packed batches.

This module imports without torch: torch is imported inside the methods that need it, so the
app (which never runs a forward) and `supports()` work where torch is not installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.architectures import known_architectures, resolve_model
from vllm_srun.plugins.base import Batch, Device, Engine, EngineModel, ModelSpec
from vllm_srun.tuning import THREADS_ENV

if TYPE_CHECKING:
    import torch

    from vllm_srun.engines.native.attention import Segments
    from vllm_srun.engines.native.layers import EncoderModel

ACCELERATORS = ("cpu", "cuda", "mps")
POOLED = ("mean", "cls", "last")
OUTPUTS = ("default", "logits", "token_logits", "hidden", *POOLED)


def torch_device(device: Device) -> torch.device:
    import torch

    if device.accelerator == "cuda":
        return torch.device("cuda", device.index or 0)
    return torch.device(device.accelerator)


class NativeEngine(Engine):
    """Runs the registered PyTorch architectures on cpu, cuda or mps, float32 or bfloat16."""

    name = "native"
    auto_priority: ClassVar[int | None] = 0
    # int8: dynamic int8 linears on the CPU (approximate; only when asked, e.g. by --max-speed).
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "int8")

    def supports(self, spec: ModelSpec, device: Device) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        if spec.architecture not in known_architectures():
            known = ", ".join(known_architectures()) or "none"
            return f"architecture {spec.architecture!r} is not registered (known: {known})"
        if device.accelerator not in ACCELERATORS:
            return f"accelerator {device.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
        if not spec.weight_files:  # an ONNX-only package: `auto` goes on to an engine that runs it
            return "the package has no safetensors weights"
        return None

    def read(self, spec: ModelSpec, dtype: str) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors on the host, floating ones already in `dtype`."""
        from vllm_srun.engines.native.weights import read_safetensors

        # int8 quantises float32 weights after loading them.
        return read_safetensors(spec.weight_files, "float32" if dtype == "int8" else dtype)

    def load(self, spec: ModelSpec, device: Device, dtype: str, host: Any) -> NativeModel:
        import torch

        from vllm_srun.engines.native.weights import torch_dtype

        if dtype == "int8" and device.accelerator != "cpu":
            raise ConfigError(f"int8 (dynamic int8 linears) runs on the cpu only, not {device}")
        if device.accelerator == "cpu" and (threads := os.environ.get(THREADS_ENV)):
            torch.set_num_threads(int(threads))
        cls = resolve_model(spec.architecture)
        tensors = host if host is not None else self.read(spec, dtype)
        # Built on the meta device: no time spent on random init that the weights overwrite.
        try:
            with torch.device("meta"):
                module = cls(spec.config)
        except ConfigError:
            raise
        except KeyError as exc:
            raise PackageError(
                f"config.json has no {exc.args[0]!r}, which {spec.architecture} needs"
            ) from exc
        except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as exc:
            # A size that is not a positive integer, heads that do not divide, ...
            raise PackageError(f"config.json does not describe a valid {spec.architecture}: {exc}") from exc
        weights_dtype = "float32" if dtype == "int8" else dtype
        module = module.to(torch_dtype(weights_dtype)).to_empty(device=torch_device(device))
        module.load_weights(tensors)
        module.eval()
        if dtype == "int8":
            # Per output channel: one scale per row keeps the fused QKV projections apart.
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
            module = torch.ao.quantization.quantize_dynamic(
                module, {torch.nn.Linear: qconfig}, dtype=torch.qint8
            )
        return NativeModel(module, device=device, dtype=dtype)


class NativeModel(EngineModel):
    """A loaded native architecture. `encode` is one forward; heads run only for rows that ask."""

    def __init__(self, module: EncoderModel, *, device: Device, dtype: str) -> None:
        self.module = module
        self.device = device
        self.dtype = dtype
        self._torch_device = torch_device(device)

    def resolve_output(self, output: str) -> str:
        """What `output` means for this model ("default" depends on the head); errors if unsupported."""
        head = self.module.head_kind
        if output == "default":
            return {"sequence": "logits", "token": "token_logits"}.get(head or "", "mean")
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r} (known: {', '.join(OUTPUTS)})")
        needs = {"logits": "sequence", "token_logits": "token"}.get(output)
        if needs is not None and head != needs:
            raise ValueError(f"output {output!r} needs a {needs} classification head; this model has none")
        return output

    def encode(self, batch: Batch) -> list[np.ndarray]:
        import torch

        from vllm_srun.engines.native.attention import Segments

        kinds = [self.resolve_output(o) for o in batch.outputs]
        lengths = np.diff(batch.offsets)
        if len(lengths) and lengths.min() <= 0:
            raise ValueError(f"row {int(np.argmin(lengths))} of the batch has no tokens")
        dev = self._torch_device
        with torch.inference_mode():
            ids = torch.as_tensor(batch.token_ids, dtype=torch.long, device=dev)
            types = (
                None
                if batch.type_ids is None
                else torch.as_tensor(batch.type_ids, dtype=torch.long, device=dev)
            )
            segments = Segments.from_offsets(batch.offsets, dev)
            hidden = self.module(ids, types, segments)
            return self._outputs(hidden, segments, kinds)

    def _outputs(self, hidden: torch.Tensor, segments: Segments, kinds: list[str]) -> list[np.ndarray]:
        import torch

        from vllm_srun.engines.native.layers import first_tokens, mean_rows

        rows_of: dict[str, list[int]] = {}
        for i, kind in enumerate(kinds):
            rows_of.setdefault(kind, []).append(i)
        spans = [(s, s + n) for s, n in zip(segments.starts, segments.lengths, strict=True)]
        results: list[np.ndarray | None] = [None] * len(kinds)

        def host(x: torch.Tensor) -> np.ndarray:
            return x.float().cpu().numpy()

        def per_row(rows: list[int], values: Sequence[np.ndarray] | np.ndarray) -> None:
            for r, value in zip(rows, values, strict=True):
                results[r] = value

        for kind, rows in rows_of.items():
            if kind == "mean":
                per_row(rows, host(mean_rows(hidden, segments, rows)))
            elif kind == "cls":
                per_row(rows, host(first_tokens(hidden, segments, rows)))
            elif kind == "last":
                per_row(rows, host(hidden[[spans[r][1] - 1 for r in rows]]))
            elif kind == "logits":
                per_row(rows, host(self.module.sequence_logits(hidden, segments, rows)))
            else:  # "hidden" and "token_logits": one [T, ...] array per row
                tokens = torch.cat([hidden[spans[r][0] : spans[r][1]] for r in rows])
                values = host(self.module.token_logits(tokens) if kind == "token_logits" else tokens)
                bounds = np.cumsum([0] + [segments.lengths[r] for r in rows])
                per_row(rows, [values[a:b] for a, b in itertools.pairwise(bounds)])
        return [r for r in results if r is not None]
