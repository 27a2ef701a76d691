"""The native engine (longer than 500 lines: load, probes and forward paths share one class's state).

PyTorch modules from the architecture registry, run on packed batches. Imports without torch
(torch is imported inside the methods that need it), so the app and `supports()` work where
torch is not installed. A row whose output is `"<kind>@<layer>"` gets that output from the
hidden states after encoder layer `layer` (1-based); a batch with such rows runs on the packed
path, through its deepest exit only.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import structlog

from vllm_srun import tuning
from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.architectures import architecture_of, known_architectures, resolve_model
from vllm_srun.plugins.base import Accelerator, Batch, Device, Engine, EngineModel, ModelSpec, WorkItem

log = structlog.get_logger("vllm_srun.engines")

if TYPE_CHECKING:
    import torch

    from vllm_srun.engines.native.attention import AttentionKernel, Segments
    from vllm_srun.engines.native.encoder import EncoderModel

POOLED = ("mean", "cls", "last")
# What the output heads (outputs.py) answer, where the family installed them (spec.extra).
HEAD_OUTPUTS = ("splade", "lexical", "colbert")
OUTPUTS = ("default", "logits", "token_logits", "hidden", *POOLED, *HEAD_OUTPUTS)
# The outputs an earlier layer can give (the heads read the last layer only), and the separator
# of an output's exit layer.
EXIT_OUTPUTS = ("hidden", *POOLED)
EXIT_SEPARATOR = "@"
# The small-batch paths (rows padded into one block) for batches of at most this many rows
# whose padding is at most this fraction of the block: beyond that the packed path costs less
# than the padded compute (bench/single_forward.py measures them all).
DENSE_MAX_ROWS = 8
DENSE_MAX_PADDING = 0.25
# The onnxruntime path is kept only if it gives the torch forward's hidden states within this
# on a probe batch (one row alone, and rows of unequal length: the masked block).
PROBE_ATOL = 1e-5
# A bfloat16 or int8 forward on the CPU of at most this many multiply-adds in its linears (its
# tokens times the model's linear weights) runs on one thread: below these sizes waking a second
# thread for each parallel region cost more than the thread saved. The bounds are where a lone
# text gained from a second thread, measured before tuning.OMP_SPIN_COUNT (docs/performance.md:
# bfloat16 and int8); int8's is higher, as oneDNN's int8 linear gains less from one. float32
# keeps its count.
ONE_THREAD_MACS = {"bfloat16": 1e9, "int8": 8e9}
# The paths under the names /v1/models and `meta` give them.
PATH_NAMES = {"packed": "native", "dense": "native-small-batch", "onnx": "onnxruntime-small-batch"}
# A lone row of every token count up to this one is run once at load in these dtypes on the
# cpu: the first forward of a new shape builds its oneDNN primitives, which a single caller
# would otherwise pay on the request (docs/performance.md has the cost). float32's lone rows
# build nothing measurable on onnxruntime or MKL's GEMMs; on oneDNN they are warmed too
# (PACKED_DTYPES). Longer rows are rarer, and their forward's own time dwarfs the build.
WARM_MAX_TOKENS = 128
WARM_DTYPES = ("bfloat16", "int8")
# The dtypes whose encoder-layer linears run on oneDNN's linear on the cpu, weights packed at
# load (packed.py), where this torch and CPU have it: for float32, faster than torch's own
# linear (MKL's GEMM). Packed after the small-batch export, which traces the plain linears, so
# a lone float32 text stays on onnxruntime, which serves it faster than torch does; without
# that graph, a float32 model whose lone rows run on oneDNN warms them as bfloat16 does
# (docs/performance.md, "float32 linears on oneDNN").
PACKED_DTYPES = ("bfloat16", "float32")
# At most this often a forward on the cpu hands the heap's free pages back to the OS, which keeps
# a worker's memory bounded under ever-new batch shapes; more often costs the forward more
# (docs/performance.md, "Memory under ever-new batch shapes").
TRIM_EVERY_S = 1.0
_PROBE = ((101, 7592, 2088, 2003, 1037, 3231, 102), (101, 2023, 102), (101, 4248, 2829, 4419, 14523, 102))


def accelerator_of(device: Device) -> Accelerator:
    """The accelerator that offers `device`: the one the loader attached, else the installed
    plugin of that name (for a Device built by hand, as tools and tests do)."""
    if device.provider is not None:
        return device.provider
    from vllm_srun.plugins.discovery import load_plugins

    accelerator: Accelerator = load_plugins().get("accelerators", device.accelerator)
    return accelerator


def torch_device_of(device: Device) -> torch.device:
    """The torch device that `device`'s accelerator offers; ConfigError when it offers none."""
    import torch

    accelerator = accelerator_of(device)
    try:
        return torch.device(accelerator.torch_device(device))
    except NotImplementedError as exc:
        raise ConfigError(str(exc) or f"accelerator {device.accelerator!r} has no torch device") from exc
    except (TypeError, RuntimeError) as exc:  # not a torch.device, nor a string naming one
        raise ConfigError(
            f"accelerator {device.accelerator!r} offers no torch device for {device}: {exc}"
        ) from exc


class NativeEngine(Engine):
    """Runs the registered PyTorch architectures, float32 or bfloat16, on any accelerator that
    offers a torch device (the built-in cpu, cuda and mps, or a plugin's), and int8 on the cpu.

    bfloat16: weights, GEMMs (float32 accumulation inside the kernel; on the cpu the encoder
    layers' linears run on oneDNN's linear with the bias added inside it, packed.py), the
    residual stream, layer norms' outputs and attention (bfloat16 products with a float32
    softmax: on the cpu short blocks as attention._plain_attention, else SDPA's kernel) are
    bfloat16; layer norms compute their statistics in float32 (torch's kernel does), and in
    BERT-style post-LayerNorm layers the residual sum into each LayerNorm is float32 too
    (bert.add_norm: rounded, it moved all-mpnet-base-v2 past the twin check;
    bench/bf16_drift.py); mean pooling sums in float32 (layers.mean_rows), rotary
    tables are float32, and every result leaves as float32. Between layers the stream stays
    bfloat16: a float32 one would add a cast on each side of every linear, and with the sums
    into the LayerNorms kept float32 the measured models pass without it.

    float32 on the cpu: the encoder layers' linears run on oneDNN's linear too where the CPU
    has it (PACKED_DTYPES), in float32 throughout.

    int8 (quantize.py): inside the encoder layers, the attention output and FFN intermediate
    projections are int8 (per-channel weights, per-token activations, int32 accumulation);
    q/k/v and the FFN output projection bfloat16 where the CPU has it (else float32); the
    residual stream, layer norms, attention, embeddings, pooling and heads float32.
    """

    name = "native"
    auto_priority: ClassVar[int | None] = 0
    # int8: int8 linears in the encoder layers on the CPU (quantize.py; approximate, only when
    # asked, e.g. by --max-speed).
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "int8")

    def supports(self, spec: ModelSpec, device: Device) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        if spec.architecture not in known_architectures():
            known = ", ".join(known_architectures()) or "none"
            return f"architecture {spec.architecture!r} is not registered (known: {known})"
        try:
            torch_device_of(device)
        except ConfigError as exc:
            return exc.message
        if not spec.weight_files:  # an ONNX-only package: `auto` goes on to an engine that runs it
            return "the package has no safetensors weights"
        return None

    def dtype_refusal(self, dtype: str, device: Device) -> str | None:
        if dtype == "int8" and device.accelerator != "cpu":
            return f"engine {self.name!r} runs int8 (int8 linears) on the cpu only, not {device}"
        return super().dtype_refusal(dtype, device)

    def read(self, spec: ModelSpec, dtype: str) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors on the host, floating ones already in `dtype`."""
        from vllm_srun.engines.native.weights import read_safetensors

        # int8 quantises float32 weights after loading them.
        tensors = read_safetensors(spec.weight_files, "float32" if dtype == "int8" else dtype)
        state_dicts = spec.extra.get("state_dicts") or {}
        if state_dicts:
            from vllm_srun.engines.native.outputs import read_state_dicts
            from vllm_srun.engines.native.weights import torch_dtype

            extra = read_state_dicts(state_dicts, torch_dtype("float32" if dtype == "int8" else dtype))
            clash = sorted(set(extra) & set(tensors))
            if clash:
                raise PackageError(f"tensor {clash[0]!r} is in the safetensors and in a state dict")
            tensors.update(extra)
        return tensors

    def load(self, spec: ModelSpec, device: Device, dtype: str, host: Any) -> NativeModel:

        from vllm_srun.engines.native.weights import materialize, meta_build, torch_dtype

        target = torch_device_of(device)
        if dtype == "int8" and target.type != "cpu":
            raise ConfigError(f"int8 (int8 linears) runs on the cpu only, not {device}")
        cls = resolve_model(spec.architecture)
        row = architecture_of(spec.architecture)
        assert row is not None  # resolve_model raised otherwise
        tensors = host if host is not None else self.read(spec, dtype)
        # Built on the meta device: no time spent on random init that the weights overwrite.
        try:
            with meta_build():
                config = row.standard_config(spec.config)
                module = cls(config, head=row.head_of(spec.architecture))
                if spec.extra.get("outputs"):
                    from vllm_srun.engines.native.outputs import install_outputs

                    # Plain attribute: the heads read their modules from the model at call time.
                    module.output_heads = install_outputs(
                        module, tuple(spec.extra["outputs"]), config, tensors
                    )
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
        module = materialize(module.to(torch_dtype(weights_dtype)), target)
        module.load_weights(tensors)
        module.eval()
        if dtype == "int8":
            from vllm_srun.engines.native.quantize import int8_model

            # Attention's input projections in bfloat16 where this CPU multiplies it natively.
            provider = accelerator_of(device)
            int8_model(module.backbone.blocks, bfloat16=provider.dtype_refusal("bfloat16", device) is None)
        kernels = accelerator_of(device).kernels()
        model = NativeModel(
            module,
            device=device,
            dtype=dtype,
            torch_device=target,
            kernels=kernels,
            fast_paths=row.fast_paths,
            graph_identity=_graph_identity(spec, config, dtype),
        )
        model.prepare_small_batches()
        if dtype in PACKED_DTYPES and target.type == "cpu":
            model.pack_linears()  # after the export, which traces the plain linears
        # Two positions short of the table: RoBERTa's positions start after its padding index.
        model.warm_single_rows(int(config.get("max_position_embeddings") or 0) - 2)
        return model


class NativeModel(EngineModel):
    """A loaded native architecture. `encode` is one forward; heads run only for rows that ask."""

    # Whether small batches may run on onnxruntime (where installed); False keeps them on torch.
    small_batch_onnx: ClassVar[bool] = True
    # The longest lone row warm_single_rows runs at load; 0 runs none.
    warm_max_tokens: ClassVar[int] = WARM_MAX_TOKENS

    def __init__(
        self,
        module: EncoderModel,
        *,
        device: Device,
        dtype: str,
        torch_device: torch.device | None = None,
        kernels: dict[str, Any] | None = None,
        fast_paths: Sequence[str] = ("dense", "onnx"),
        graph_identity: str | None = None,
    ) -> None:
        self.module = module
        # What built the module (graph_cache.graph_key's `identity`); None keeps its small-batch
        # graph out of the cache.
        self.graph_identity = graph_identity
        self.fast_paths = tuple(fast_paths)
        self.device = device
        self.dtype = dtype
        self._torch_device = torch_device if torch_device is not None else torch_device_of(device)
        # Of the accelerator's kernels, those this engine has a use for; it ignores the rest.
        self.attention: AttentionKernel | None = (kernels or {}).get("scaled_dot_product_attention")
        self._onnx: Any = None  # the small-batch onnxruntime session (prepare_small_batches)
        from vllm_srun.engines.native.packed import PackedLinear

        # Whether oneDNN runs the encoder layers' linears (packed.py), building a primitive per
        # token count.
        self.packed_linears = any(isinstance(m, PackedLinear) for m in module.modules())
        # (in, out) of each of the module's linears (nn.Linear and the packed and quantized ones,
        # which keep its in_features and out_features), and their multiply-adds per token.
        self.linear_shapes: list[tuple[int, int]] = []
        for m in module.modules():
            width_in, width_out = getattr(m, "in_features", None), getattr(m, "out_features", None)
            if isinstance(width_in, int) and isinstance(width_out, int):
                self.linear_shapes.append((width_in, width_out))
        self.linear_macs = sum(i * o for i, o in self.linear_shapes)

    @property
    def exit_layers(self) -> tuple[int, ...]:
        """The encoder layers (1-based) whose output a row may ask for: every layer where the
        architecture can stop early, else none (only its last, by asking for no layer)."""
        return tuple(range(1, self.module.num_layers + 1))

    def resolve_exit(self, output: str) -> tuple[str, int | None]:
        """`output` as (kind, exit layer); the layer is None for the last one, whether named or
        not, so the last layer runs one way. ValueError for a layer the model does not have."""
        kind, separator, layer = output.partition(EXIT_SEPARATOR)
        if not separator:
            return self.resolve_output(output), None
        layers = self.exit_layers
        if not layers:
            raise ValueError(
                f"output {output!r}: {type(self.module).__name__} cannot exit at an earlier layer"
            )
        if not layer.isdigit() or int(layer) not in layers:
            raise ValueError(f"output {output!r}: the model's layers are 1..{layers[-1]}")
        resolved = self.resolve_output(kind)
        if resolved not in EXIT_OUTPUTS:
            raise ValueError(f"output {output!r}: an earlier layer gives only {', '.join(EXIT_OUTPUTS)}")
        return resolved, None if int(layer) == layers[-1] else int(layer)

    def resolve_output(self, output: str) -> str:
        """What `output` means for this model ("default" depends on the head); errors if unsupported."""
        head = self.module.head_kind
        if output == "default":
            return {"sequence": "logits", "token": "token_logits"}.get(head or "", "mean")
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r} (known: {', '.join(OUTPUTS)})")
        if output in HEAD_OUTPUTS and output not in getattr(self.module, "output_heads", {}):
            raise ValueError(f"output {output!r} needs an output head this package does not ship")
        needs = {"logits": "sequence", "token_logits": "token"}.get(output)
        if needs is not None and head != needs:
            raise ValueError(f"output {output!r} needs a {needs} classification head; this model has none")
        return output

    @property
    def paths(self) -> tuple[str, ...]:
        """The forward paths this model may take: "packed" always; for small batches (see
        `dense_rows`) on the cpu, "dense" where the architecture's row declares it, and "onnx"
        where onnxruntime runs that dense forward (declared, float32, no accelerator attention
        kernel, and the export passed its probe)."""
        if not self._small_batches():
            return ("packed",)
        return ("packed", "dense", "onnx") if self._onnx is not None else ("packed", "dense")

    def describe(self) -> dict[str, Any]:
        """What /v1/models reports of this model's engine: the paths the engine may choose
        (`choose_path`) under their public names, and the memory a small-batch path added
        beyond the module's own weights (bytes per path; 0 for one that shares them)."""
        chosen = ("packed", self.paths[-1]) if len(self.paths) > 1 else self.paths
        memory = {PATH_NAMES[p]: 0 for p in chosen}
        if self._onnx is not None and self._onnx.memory_bytes is not None:
            memory[PATH_NAMES["onnx"]] = self._onnx.memory_bytes
        return {"engine_paths": [PATH_NAMES[p] for p in chosen], "memory_bytes": memory}

    def pack_linears(self) -> None:
        """Put the encoder layers' linears on oneDNN's linear (packed.py), where this torch and
        CPU have it."""
        from vllm_srun.engines.native.packed import pack_linears

        self.packed_linears = pack_linears(self.module.backbone.blocks) > 0 or self.packed_linears

    def _small_batches(self) -> bool:
        # Measured and parity-tested on the cpu only; int8's quantised linears were not measured.
        return "dense" in self.fast_paths and self.dtype != "int8" and self._torch_device.type == "cpu"

    def prepare_small_batches(self) -> None:
        """Export the dense forward to onnxruntime where it can run (done at load, so no request
        waits for it), on the intra-op thread count the forward threads will have (the
        configured one, else this thread's torch count), so it is the one session every forward
        uses. It is kept only when it reproduces the torch forward on a probe batch within
        PROBE_ATOL; otherwise, or when the export fails, small batches stay on torch."""
        from vllm_srun.engines.native import onnx_path

        if not (
            self._small_batches()
            and "onnx" in self.fast_paths
            and self.small_batch_onnx
            and self.dtype == "float32"
            and self.attention is None
            and onnx_path.available()
        ):
            return
        import torch

        from vllm_srun.engines.native import graph_cache

        threads = tuning.forward_threads() or torch.get_num_threads()
        try:
            key = graph_cache.key_for(self.module, self.graph_identity)
        except Exception as exc:  # a module the key cannot read is exported, uncached
            log.warning("small_batch_onnx_uncached", error=f"{type(exc).__name__}: {exc}")
            key = None
        # At most twice: a kept graph that fails the probe is dropped and exported afresh once,
        # uncached if it could not be dropped.
        for _ in range(2):
            try:
                session = onnx_path.OnnxSmallBatch(self.module, threads, key)
            except Exception as exc:  # an export or session failure costs speed, never an answer
                log.warning("small_batch_onnx_unavailable", error=f"{type(exc).__name__}: {exc}")
                return
            worst = self._probe(session)
            if worst <= PROBE_ATOL:
                return
            if key is not None:  # never kept for the next start to fail on again
                graph_cache.drop_graph(key)
            if not session.from_cache:
                log.warning("small_batch_onnx_differs", max_abs_diff=worst)
                return
            log.warning("small_batch_onnx_cache_stale", max_abs_diff=worst)
            if key is not None and graph_cache.cached_graph(key) is not None:
                key = None

    def warm_single_rows(self, positions: int) -> int:
        """One forward of a lone row of each token count up to `warm_max_tokens` (and
        `positions`, where that is positive) in WARM_DTYPES on the cpu, on the forward threads'
        count; how many ran. Done at load, so no caller waits for a shape's first build."""
        import torch

        limit = min(self.warm_max_tokens, positions) if positions > 0 else self.warm_max_tokens
        per_shape = self.dtype in WARM_DTYPES or (self.packed_linears and self._onnx is None)
        if self._torch_device.type != "cpu" or not per_shape or limit < 1:
            return 0
        vocab = self.module.vocab_size
        filler = [t % vocab for t in _PROBE[0]]
        threads = tuning.forward_threads() or torch.get_num_threads()
        with tuning.intra_op_threads(threads):
            for count in range(1, limit + 1):
                row = [filler[i % len(filler)] for i in range(count)]
                self.encode(Batch.from_items([WorkItem(token_ids=row, output="hidden")]))
        return limit

    def _probe(self, session: Any) -> float:
        """The largest difference between `session` and the torch dense forward on the probe
        rows, one row alone and all together; `session` serves small batches when it is within
        PROBE_ATOL (it is left in place then, and taken away otherwise)."""
        vocab = self.module.vocab_size
        rows = [[t % vocab for t in row] for row in _PROBE]
        self._onnx, worst = session, 0.0
        for probe in (rows[:1], rows):
            batch = Batch.from_items([WorkItem(token_ids=r, output="hidden") for r in probe])
            pairs = zip(self.encode(batch, path="dense"), self.encode(batch, path="onnx"), strict=True)
            worst = max(worst, *(float(np.abs(a - b).max()) for a, b in pairs))
        if not worst <= PROBE_ATOL:
            self._onnx = None
        return worst

    def dense_rows(self, lengths: np.ndarray) -> bool:
        """Whether a batch with these row lengths runs on a small-batch (padded block) path."""
        if not 0 < len(lengths) <= DENSE_MAX_ROWS:
            return False
        padded = len(lengths) * int(lengths.max())
        return padded - int(lengths.sum()) <= DENSE_MAX_PADDING * padded

    def choose_path(self, lengths: np.ndarray) -> str:
        """The path a batch with these row lengths takes when the caller does not force one."""
        paths = self.paths
        if len(paths) == 1 or not self.dense_rows(lengths):
            return "packed"
        return paths[-1]

    def encode(self, batch: Batch, *, path: str | None = None) -> list[np.ndarray]:
        """One forward. `path` forces one of `paths` (tools and tests compare them); None lets
        `choose_path` pick by the batch's shape. On the cpu, the heap's free pages then go back
        to the OS at most every TRIM_EVERY_S."""
        outputs = self._encode(batch, path)
        if self._torch_device.type == "cpu":
            tuning.return_freed_memory(TRIM_EVERY_S)
        return outputs

    def _encode(self, batch: Batch, path: str | None) -> list[np.ndarray]:
        import torch

        from vllm_srun.engines.native.attention import Segments

        resolved = [self.resolve_exit(o) for o in batch.outputs]
        kinds = [kind for kind, _ in resolved]
        exits = {layer for _, layer in resolved if layer is not None}
        lengths = np.diff(batch.offsets)
        if len(lengths) and lengths.min() <= 0:
            raise ValueError(f"row {int(np.argmin(lengths))} of the batch has no tokens")
        if path is None:
            # The small-batch paths run every layer: early exits take the packed one.
            path = "packed" if exits else self.choose_path(lengths)
        elif path not in self.paths:
            raise ValueError(f"path {path!r} is not one this model runs (it runs: {', '.join(self.paths)})")
        elif exits and path != "packed":
            raise ValueError(f"rows that exit at an earlier layer run on the packed path, not {path!r}")
        dev = self._torch_device
        threads = torch.get_num_threads()
        if dev.type == "cpu" and int(lengths.sum()) * self.linear_macs <= ONE_THREAD_MACS.get(self.dtype, 0):
            threads = 1
        with torch.inference_mode(), tuning.intra_op_threads(threads):
            ids = torch.as_tensor(batch.token_ids, dtype=torch.long, device=dev)
            types = (
                None
                if batch.type_ids is None
                else torch.as_tensor(batch.type_ids, dtype=torch.long, device=dev)
            )
            segments = Segments.from_offsets(
                batch.offsets, dev, attention=self.attention, key_lengths=batch.key_lengths
            )
            if exits:
                return self._exit_outputs(ids, types, segments, resolved, batch.token_ids)
            if path == "packed" or not len(lengths):
                hidden = self.module(ids, types, segments)
            elif path == "onnx":
                hidden = self._onnx_forward(batch, lengths)
            else:
                hidden = self._dense_forward(ids, types, lengths, batch.key_lengths)
            return self._outputs(hidden, segments, kinds, batch.token_ids)

    def _exit_outputs(
        self,
        ids: torch.Tensor,
        types: torch.Tensor | None,
        segments: Segments,
        resolved: list[tuple[str, int | None]],
        token_ids: np.ndarray,
    ) -> list[np.ndarray]:
        """Each row's output from the layer it exits at: one forward, as deep as the deepest."""
        last = self.exit_layers[-1]
        wanted = [(kind, last if layer is None else layer) for kind, layer in resolved]
        states = self.module.hidden_at(ids, types, segments, {layer for _, layer in wanted})
        results: list[np.ndarray | None] = [None] * len(wanted)
        for number, hidden in states.items():
            kinds = [kind if layer == number else None for kind, layer in wanted]
            for i, value in enumerate(self._outputs(hidden, segments, kinds, token_ids, keep_rows=True)):
                if value is not None:
                    results[i] = value
        return [r for r in results if r is not None]

    def _onnx_forward(self, batch: Batch, lengths: np.ndarray) -> torch.Tensor:
        """Packed hidden states [tokens, hidden] from onnxruntime on the rows padded into one block."""
        import torch

        width = int(lengths.max())
        valid = np.arange(width)[None, :] < lengths[:, None]
        ids = np.zeros(valid.shape, dtype=np.int64)
        ids[valid] = batch.token_ids  # rows are packed back to back, in row-major order
        types = np.zeros(valid.shape, dtype=np.int64)
        if batch.type_ids is not None:
            types[valid] = batch.type_ids
        # The graph reads its attention mask as the key mask only (Block.traced), so tokens that
        # are not keys are left out of it and still read back.
        keys = valid if batch.key_lengths is None else np.arange(width)[None, :] < batch.key_lengths[:, None]
        hidden = self._onnx.hidden(ids, types, keys.astype(np.int64))
        return torch.from_numpy(hidden[valid])

    def _dense_forward(
        self,
        ids: torch.Tensor,
        types: torch.Tensor | None,
        lengths: np.ndarray,
        key_lengths: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Packed hidden states [tokens, hidden] computed on the rows padded into one block."""
        from vllm_srun.engines.native.attention import Block

        block = Block(lengths, ids.device, attention=self.attention, key_lengths=key_lengths)
        hidden = self.module(block.scatter(ids), None if types is None else block.scatter(types), block)
        return block.gather(hidden)

    def _outputs(
        self,
        hidden: torch.Tensor,
        segments: Segments,
        kinds: Sequence[str | None],
        token_ids: np.ndarray,
        *,
        keep_rows: bool = False,
    ) -> list[Any]:
        """Each row's output of its kind from `hidden`; a row whose kind is None gets none (with
        `keep_rows`, None in its place). `token_ids` are the batch's packed ids, which a
        sequence head may read (heads.Head)."""
        import torch

        from vllm_srun.engines.native.layers import first_tokens, mean_rows

        rows_of: dict[str, list[int]] = {}
        for i, kind in enumerate(kinds):
            if kind is not None:
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
                per_row(rows, host(self.module.sequence_logits(hidden, segments, rows, token_ids)))
            elif kind in HEAD_OUTPUTS:
                head = self.module.output_heads[kind]
                per_row(rows, [host(head.rows(self.module, hidden[spans[r][0] : spans[r][1]])) for r in rows])
            else:  # "hidden" and "token_logits": one [T, ...] array per row
                tokens = torch.cat([hidden[spans[r][0] : spans[r][1]] for r in rows])
                values = host(self.module.token_logits(tokens) if kind == "token_logits" else tokens)
                bounds = np.cumsum([0] + [segments.lengths[r] for r in rows])
                per_row(rows, [values[a:b] for a, b in itertools.pairwise(bounds)])
        return results if keep_rows else [r for r in results if r is not None]


def _graph_identity(spec: ModelSpec, config: Mapping[str, Any], dtype: str) -> str:
    """What built a native module, for its small-batch graph's cache key: the architecture,
    the configuration it was built from, the output heads asked for and the dtype."""
    import json

    built = {"architecture": spec.architecture, "config": config, "outputs": spec.extra.get("outputs")}
    return json.dumps({**built, "dtype": dtype}, sort_keys=True, default=repr)
