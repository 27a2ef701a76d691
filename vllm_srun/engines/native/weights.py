"""Reading safetensors into host tensors and loading them into a module by name.

A loader returns the checkpoint names it consumed; any parameter left unfilled or any tensor
with nowhere to go is a `PackageError` that names it, so a renamed or truncated checkpoint
never runs with zeros or random weights.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun.errors import PackageError

if TYPE_CHECKING:
    import torch

TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}

_META_BUILDS = threading.Lock()


def materialize(module: Any, device: Any) -> Any:
    """`module.to_empty(device=device)`: its meta tensors replaced by uninitialised ones on
    `device`, of the same shapes and dtypes (the weights are loaded into them next).

    torch's own to_empty allocates each through `torch.empty_like`, whose meta-tensor path is a
    Python decomposition that imports sympy on its first call, a share of every load spent on
    an import; `torch.empty` of the same shape and dtype makes the same storage directly.
    """
    import torch

    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


@contextlib.contextmanager
def meta_build() -> Iterator[None]:
    """Build modules on the meta device, skipping the random init the weights overwrite.

    A meta tensor has no values, yet torch still runs `reset_parameters` on it, through Python
    decompositions whose first call imports torch._dynamo (seconds of every model load, for
    nothing). Inside, the `torch.nn.init` functions return a meta tensor untouched; any other
    tensor (another thread's real module) is initialised by the original function, as always.
    """
    import torch
    import torch.nn.init as init

    def passing_meta(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def init_unless_meta(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
            return original(tensor, *args, **kwargs)

        return init_unless_meta

    with _META_BUILDS:
        names = [
            n for n in vars(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))
        ]
        originals = {name: getattr(init, name) for name in names}
        try:
            for name, original in originals.items():
                setattr(init, name, passing_meta(original))
            with torch.device("meta"):
                yield
        finally:
            for name, original in originals.items():
                setattr(init, name, original)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in TORCH_DTYPES:
        raise PackageError(f"dtype {name!r} is not supported by the native engine (float32, bfloat16)")
    return getattr(torch, TORCH_DTYPES[name])


def read_safetensors(files: Iterable[Path], dtype: str) -> dict[str, torch.Tensor]:
    """Every tensor of `files` on the host, floating ones cast to `dtype`.

    Integer tensors (such as `position_ids` buffers) keep their type: they are index data.
    A name found in two files is an error rather than a silent override.
    """
    from safetensors import safe_open

    target = torch_dtype(dtype)
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:  # SafetensorError on a truncated, empty or foreign file
            raise PackageError(f"{path.name} is not a readable safetensors file: {exc}") from exc
        with handle:
            for name in handle.keys():
                if name in tensors:
                    raise PackageError(f"tensor {name!r} appears in more than one weight file ({path.name})")
                tensor = handle.get_tensor(name)
                tensors[name] = tensor.to(target) if tensor.is_floating_point() else tensor
    return tensors


@dataclass(frozen=True)
class Stacked:
    """Checkpoint tensors that land in one slice of a fused parameter.

    `source` and `target` are dotted name fragments: with ("self.query", "self.qkv", 0, 3) the
    checkpoint's `...self.query.weight` fills the first third of `...self.qkv.weight`.
    """

    source: str
    target: str
    shard: int
    shards: int


def load_named(
    module: torch.nn.Module,
    tensors: Mapping[str, torch.Tensor],
    *,
    rename: Callable[[str], str] = lambda name: name,
    stacked: Sequence[Stacked] = (),
    harmless: Callable[[str], bool] = lambda name: False,
) -> set[str]:
    """Copy `tensors` into `module`'s parameters; return the checkpoint names loaded.

    `rename` maps a checkpoint name to the module's naming (prefix handling); `harmless`
    names checkpoint tensors that are skipped on purpose. Anything else that does not match a
    parameter, a shape mismatch, or a parameter nobody filled raises `PackageError`.
    """
    import torch

    params = dict(module.named_parameters())
    wanted: dict[tuple[str, int], str] = {}  # (parameter, shard) -> checkpoint-style name for errors
    for pname in params:
        fused = [s for s in stacked if f".{s.target}." in f".{pname}"]
        if fused:
            for s in fused:
                wanted[(pname, s.shard)] = pname.replace(s.target, s.source)
        else:
            wanted[(pname, 0)] = pname

    loaded: set[str] = set()
    with torch.no_grad():
        for name, tensor in tensors.items():
            if harmless(name):
                continue
            pname, shard, shards = rename(name), 0, 1
            for s in stacked:
                if f".{s.source}." in f".{pname}":
                    pname, shard, shards = pname.replace(s.source, s.target), s.shard, s.shards
                    break
            if pname not in params:
                raise PackageError(f"unexpected tensor {name!r} in the weights (no such parameter)")
            if (pname, shard) not in wanted:
                raise PackageError(f"tensor {name!r} fills a parameter another tensor already filled")
            dest = params[pname].chunk(shards, dim=0)[shard] if shards > 1 else params[pname]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise PackageError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                )
            if tensor.dtype.is_floating_point != dest.dtype.is_floating_point:
                # copy_ would cast an int or bool tensor into weights without a word.
                raise PackageError(f"tensor {name!r} is {tensor.dtype}, expected a floating-point tensor")
            dest.copy_(tensor)
            del wanted[(pname, shard)]
            loaded.add(name)
    if wanted:
        missing = ", ".join(sorted(wanted.values())[:8])
        raise PackageError(f"missing tensor(s) in the weights: {missing} ({len(wanted)} in all)")
    return loaded
