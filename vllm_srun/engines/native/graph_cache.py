"""Where the small-batch ONNX graphs live between processes: exported once per model, reused by
every later start of the same model with the same code.

The key digests the weights, the module's configuration, its forward's code and the exporter
(`graph_key`); the engine's probe still compares a cached graph with the torch forward before
serving it. The folder is `$VLLM_SRUN_CACHE_DIR/small-batch-onnx` (else the XDG cache), 0700;
`VLLM_SRUN_CACHE_DIR=off` turns it off. Entries unused for UNUSED_S are removed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_srun.engines.native.encoder import EncoderModel

CACHE_ENV = "VLLM_SRUN_CACHE_DIR"
GRAPH_FILE = "dense.onnx"
STAGING_PREFIX = ".export-"
# An entry no start has opened for 30 days is removed when another is stored (opening one
# renews its folder's mtime).
UNUSED_S = 30 * 86400
# A staging folder untouched for an hour is an export whose process died: exports take seconds.
STALE_EXPORT_S = 3600


def cache_root() -> Path | None:
    """The folder graphs are kept in, None when the cache is off, or when the folder exists but
    is not this user's alone (a graph planted there by another user is never opened)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        if configured.strip().lower() in ("", "off", "0", "none"):
            return None
        base = Path(configured)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "vllm-srun"
    root = base / "small-batch-onnx"
    try:
        found = root.lstat()
    except OSError:
        return root  # made by store_graph, private
    mine = found.st_uid == os.geteuid() and stat.S_ISDIR(found.st_mode)
    return root if mine and found.st_mode & 0o077 == 0 else None


def key_for(model: EncoderModel, identity: str | None) -> str | None:
    """`graph_key`, or None when there is nothing to key (no identity, the cache off)."""
    if identity is None or cache_root() is None:
        return None
    return graph_key(model, identity)


def graph_key(model: EncoderModel, identity: str) -> str:
    """The digest a graph of `model` is kept under: `identity` (what built the module: its
    architecture, configuration and dtype, as the engine states them), every parameter and
    buffer (name, dtype, shape, bytes), the source of every class in the module tree and of
    the native engine, and the torch and onnx versions that export it."""
    import torch

    digest = hashlib.sha256()
    for part in (identity, torch.__version__, _version("onnx"), _engine_source_digest()):
        digest.update(part.encode() + b"\0")
    for path in sorted(_class_files(model)):
        digest.update(_file_digest(path).encode())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # a 0-d tensor has no byte view
        digest.update(f"{name}:{flat.dtype}:{tuple(flat.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    return digest.hexdigest()


def cached_graph(key: str) -> Path | None:
    """The graph kept under `key`, None when there is none (or the cache is off)."""
    root = cache_root()
    path = None if root is None else root / key / GRAPH_FILE
    if path is None or not path.is_file():
        return None
    try:
        os.utime(path.parent)  # used now: kept another UNUSED_S
    except OSError:
        pass
    return path


def store_graph(key: str, export: Callable[[Path], None]) -> Path | None:
    """Run `export(folder)` into a fresh folder of the cache and publish it as `key`; the
    graph's path, or None when the cache is off or cannot be written. Published by a rename,
    so a reader never sees half a graph; when another process published `key` first, its
    graph is the one returned and this one is removed."""
    root = cache_root()
    if root is None:
        return None
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(exist_ok=True, mode=0o700)
        if cache_root() is None:  # there, but not this user's alone
            return None
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    except OSError:
        return None
    try:
        export(staging)
        try:
            staging.rename(root / key)
        except OSError:  # published meanwhile by another process
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    prune(root, keep=key)
    return cached_graph(key)


def prune(root: Path, keep: str) -> None:
    """Remove the entries of `root` unused for UNUSED_S and the staging folders untouched for
    STALE_EXPORT_S, all but `keep`; an entry another process removes or renews meanwhile is
    left to it."""
    now = time.time()
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name == keep:
            continue
        limit = STALE_EXPORT_S if entry.name.startswith(STAGING_PREFIX) else UNUSED_S
        try:
            idle = now - entry.lstat().st_mtime
        except OSError:
            continue
        if idle > limit:
            shutil.rmtree(entry, ignore_errors=True)


def drop_graph(key: str) -> None:
    """Remove the graph kept under `key` (one that failed the engine's probe)."""
    root = cache_root()
    if root is not None:
        shutil.rmtree(root / key, ignore_errors=True)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@cache
def _engine_source_digest() -> str:
    """The native engine's own source (layers, attention, the export): one digest a process."""
    folder = Path(__file__).parent
    return hashlib.sha256(b"".join(_file_digest(p).encode() for p in sorted(folder.glob("*.py")))).hexdigest()


def _class_files(model: EncoderModel) -> set[str]:
    """The source files of every class in the module tree and their bases (a plugin's
    architecture lives outside the engine's folder)."""
    files: set[str] = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__ in ("builtins",) or cls.__module__.startswith("torch."):
                continue
            source = sys.modules.get(cls.__module__)
            try:
                path = inspect.getsourcefile(source) if source is not None else None
            except TypeError:
                path = None
            if path:
                files.add(path)
    return files


@cache
def _file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
