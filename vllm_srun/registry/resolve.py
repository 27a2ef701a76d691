"""From what `serve` was given to a model package on disk.

A reference is, in this order: a local package directory; a built-in model's name (its pinned
repository and revision); a Hugging Face id `org/name[@REVISION]`, read from the local Hugging
Face cache. It is served under the name its package gives its model (else its folder name, then
accepted as an alias), its built-in name or its repository id unless told otherwise. A missing repository is downloaded only when the caller allows it and
`HF_HUB_OFFLINE` is unset; a built-in model's pinned files are verified before anything reads them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.registry.names import own_name
from vllm_srun.registry.tables import BuiltinModel, Tables, verify_files

log = structlog.get_logger("vllm_srun.registry")

_REPO = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>.+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# The package rule refuses these anyway; not downloading them saves the bandwidth.
_NEVER_DOWNLOAD = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt", "*.h5", "*.msgpack", "*.ot"]
_PICKLED = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


@dataclass(frozen=True)
class Resolved:
    """A resolved reference: the package, and its table entry when it is a built-in model."""

    package: ModelPackage
    builtin: BuiltinModel | None = None
    repository: str | None = None
    revision: str | None = None
    # The name the model is served under by default; None: the package's (its folder's) name.
    default_name: str | None = None
    # Other names requests may use by default: a folder's name, where the model has its own.
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.default_name or self.package.name


class CachedSnapshot(ModelPackage):
    """A snapshot in the Hugging Face cache.

    Its files are symlinks into the repository's `blobs/` folder, so the package rule "no
    symlink leaves the package" is widened to that folder and nothing else: a link must be
    named inside the snapshot and point at a blob of the same repository.
    """

    def __init__(self, root: Path, *, name: str, repo_dir: Path) -> None:
        super().__init__(root, name=name)
        self.blobs = (repo_dir / "blobs").resolve()

    def path(self, relative: str, *, state_dict: bool = False) -> Path:
        try:
            return super().path(relative, state_dict=state_dict)
        except PackageError:
            named = Path(os.path.normpath(self.root / relative))
            target = (self.root / relative).resolve()
            if (not state_dict and relative.endswith(_PICKLED)) or not named.is_relative_to(self.root):
                raise
            if not target.is_relative_to(self.blobs):
                raise
            return target


def hub_cache_dir() -> Path:
    """Where the Hugging Face cache lives, by the same variables huggingface_hub reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def repo_dir(cache: Path, repository: str) -> Path:
    return cache / ("models--" + repository.replace("/", "--"))


def _snapshot(cache: Path, repository: str, revision: str | None) -> Path | None:
    """The snapshot directory of `repository` at `revision` in `cache`, or None if absent."""
    base = repo_dir(cache, repository)
    if revision is not None and _COMMIT.fullmatch(revision):
        found = base / "snapshots" / revision
        return found if found.is_dir() else None
    ref = base / "refs" / (revision or "main")
    if ref.is_file():
        commit = ref.read_text().strip()
        found = base / "snapshots" / commit
        return found if found.is_dir() else None
    if revision is None:
        # Downloaded at a pinned commit only: no refs/main, but one unambiguous snapshot.
        snapshots = sorted(p for p in (base / "snapshots").glob("*") if p.is_dir())
        if len(snapshots) == 1:
            return snapshots[0]
    return None


def _download(repository: str, revision: str | None, cache: Path) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ConfigError(
            f"model {repository!r} is not cached and huggingface_hub is not installed to download it"
        ) from exc
    log.info("model_download", repository=repository, revision=revision or "main", cache=str(cache))
    try:
        path = snapshot_download(
            repository, revision=revision, cache_dir=cache, ignore_patterns=_NEVER_DOWNLOAD
        )
    except Exception as exc:  # network, authentication, unknown repository: all stop the start
        raise ConfigError(f"downloading {repository!r} failed: {type(exc).__name__}: {exc}") from exc
    return Path(str(path))


def resolve_repository(
    repository: str, revision: str | None, *, allow_download: bool = False, name: str | None = None
) -> Resolved:
    """A repository at `revision` (default: refs/main) from the cache, downloading if allowed."""
    if revision is not None and not (_COMMIT.fullmatch(revision) or re.fullmatch(r"[\w.-]+", revision)):
        raise ConfigError(f"revision {revision!r} of {repository!r} is neither a 40-hex commit nor a ref")
    cache = hub_cache_dir()
    found = _snapshot(cache, repository, revision)
    if found is None:
        wanted = f"{repository}@{revision}" if revision else repository
        where = repo_dir(cache, repository)
        if revision is not None and _COMMIT.fullmatch(revision):
            looked = where / "snapshots" / revision
        else:
            looked = where / "refs" / (revision or "main")
        if not allow_download or hub_offline():
            fetch = f"hf download {repository}" + (f" --revision {revision}" if revision else "")
            # `hf` is huggingface_hub's command since 0.34 (huggingface-cli before it).
            how = f"fetch it with `{fetch}` (`pip install huggingface_hub`), " + (
                "or unset HF_HUB_OFFLINE to let --allow-download fetch it"
                if allow_download
                else "or start with --allow-download to fetch it as the server starts"
            )
            why = "HF_HUB_OFFLINE is set" if allow_download else "downloads are not allowed"
            raise ConfigError(
                f"model {wanted!r} is not in the Hugging Face cache (looked for {str(looked)!r}; "
                f"cache {str(cache)!r} from HF_HUB_CACHE / HF_HOME) and {why}: {how}"
            )
        found = _download(repository, revision, cache)
    commit = found.name
    label = name or repository.rsplit("/", 1)[-1]
    package = CachedSnapshot(found, name=label, repo_dir=repo_dir(cache, repository))
    return Resolved(package=package, repository=repository, revision=commit, default_name=name or repository)


def resolve(ref: str, *, tables: Tables, allow_download: bool = False) -> Resolved:
    """Resolve `ref` (see the module docstring); ConfigError says what was looked for, and where.

    A built-in model (by name, or by its repository at the pinned revision) has its files
    verified here, before any family reads them; conflicting tables refuse every reference.
    """
    tables.check()
    path = Path(ref).expanduser()
    if path.is_dir():
        package = ModelPackage(path)
        own = own_name(package)
        if own is None or own == package.name:
            return Resolved(package=package)
        return Resolved(package=package, default_name=own, aliases=(package.name,))
    builtin = tables.get(ref)
    if builtin is not None:
        found = resolve_repository(
            builtin.repository, builtin.revision, allow_download=allow_download, name=builtin.name
        )
        verify_files(builtin, found.package)
        return Resolved(found.package, builtin, found.repository, found.revision, builtin.name)
    match = _REPO.fullmatch(ref)
    if match is None or ref.startswith((".", "/", "~")):
        names = ", ".join(sorted(tables.models)) or "none"
        raise ConfigError(
            f"model {ref!r} is not a package directory, a Hugging Face repository id "
            f"(org/name[@revision]) or a built-in model (built-in: {names})"
        )
    found = resolve_repository(match["repo"], match["revision"], allow_download=allow_download)
    pinned = tables.for_repository(match["repo"])
    if pinned is not None and pinned.revision == found.revision:
        verify_files(pinned, found.package)
        return Resolved(found.package, pinned, found.repository, found.revision, found.default_name)
    return found
