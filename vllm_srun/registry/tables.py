"""Built-in model tables: well-known models a family serves by name, pinned and verified.

A family names its table module in `ModelFamily.builtin_table`; its `MODELS` lists
`BuiltinModel`s. A table that fails to import pins nothing (`Tables.skipped`); two entries
pinning one repository or name, or a model of another family, refuse every model of the
process (`Tables.check()`); a built-in model's files are verified before load (`verify_files`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.base import ModelFamily, Verification
from vllm_srun.plugins.package import ModelPackage, combined_sha256, sha256_file

log = structlog.get_logger("vllm_srun.registry")

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class GoldenRecord:
    """A recorded answer: `request` (the surface's JSON body) and a subset of its response.

    Numbers in `expected` match within `atol`; a list under an `embedding` key matches by
    cosine similarity >= 1 - atol. Keys absent from `expected` are not compared.
    """

    surface: str
    request: Mapping[str, Any]
    expected: Mapping[str, Any]
    atol: float = 1e-3


@dataclass(frozen=True, kw_only=True)
class BuiltinModel:
    """One pinned model: where it comes from, what its files must hash to, what it answers.

    `files` maps every file the family loads (path relative to the package) to its SHA-256;
    `model_sha256` is `combined_sha256(files)`, the identity the family's `verify` computes.
    `golden` holds recorded answers per device class ("cpu", "cuda", ...).
    """

    name: str
    repository: str
    revision: str
    family: str
    model_sha256: str
    files: Mapping[str, str]
    licence: str
    golden: Mapping[str, Sequence[GoldenRecord]] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class SkippedTable:
    family: str
    module: str
    reason: str


@dataclass(frozen=True)
class _Pin:
    model: BuiltinModel
    family: str
    module: str

    def where(self) -> str:
        return f"table {self.module} (family {self.family}, model {self.model.name!r})"


@dataclass
class Tables:
    """The built-in models of this process, by name; `conflict` is set when tables disagree."""

    models: dict[str, BuiltinModel] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)  # model name -> its table module
    skipped: list[SkippedTable] = field(default_factory=list)
    conflict: str | None = None

    def check(self) -> None:
        """Raise ConfigError while two tables conflict: no model may load until it is fixed."""
        if self.conflict is not None:
            raise ConfigError(self.conflict)

    def get(self, name: str) -> BuiltinModel | None:
        return self.models.get(name)

    def for_repository(self, repository: str) -> BuiltinModel | None:
        return next((m for m in self.models.values() if m.repository == repository), None)


def _validate(model: Any, module: str) -> BuiltinModel:
    if not isinstance(model, BuiltinModel):
        raise ValueError(f"MODELS holds {type(model).__name__}, not BuiltinModel")
    where = f"model {model.name!r}"
    if not _HEX40.fullmatch(model.revision):
        raise ValueError(f"{where}: revision {model.revision!r} is not a 40-hex commit")
    if "/" not in model.repository:
        raise ValueError(f"{where}: repository {model.repository!r} is not 'org/name'")
    if not model.files:
        raise ValueError(f"{where}: pins no files")
    bad = next((f for f, d in model.files.items() if not _HEX64.fullmatch(d)), None)
    if bad is not None:
        raise ValueError(f"{where}: the digest of {bad!r} is not a 64-hex SHA-256")
    if combined_sha256(dict(model.files)) != model.model_sha256:
        raise ValueError(f"{where}: model_sha256 is not the combined digest of its files")
    return model


def _import_table(module: str) -> list[BuiltinModel]:
    table = importlib.import_module(module)
    models = getattr(table, "MODELS", None)
    if not isinstance(models, list | tuple):
        raise ValueError("the module has no MODELS list")
    return [_validate(m, module) for m in models]


def load_tables(families: Iterable[ModelFamily]) -> Tables:
    """Import every family's `builtin_table` and check the pins against each other."""
    tables = Tables()
    pins: list[_Pin] = []
    for family in sorted(families, key=lambda f: f.name):
        module = family.builtin_table
        if not module:
            continue
        try:
            models = _import_table(module)
        except Exception as exc:  # a broken table must not stop the other families' models
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("builtin_table_skipped", family=family.name, table=module, reason=reason)
            tables.skipped.append(SkippedTable(family.name, module, reason))
            continue
        pins += [_Pin(m, family.name, module) for m in models]
    tables.conflict = _first_conflict(pins)
    if tables.conflict is not None:
        log.error("builtin_tables_conflict", reason=tables.conflict)
    for pin in pins:
        tables.models.setdefault(pin.model.name, pin.model)
        tables.modules.setdefault(pin.model.name, pin.module)
    return tables


def _first_conflict(pins: list[_Pin]) -> str | None:
    suffix = "; every model is refused until one of them is removed"
    for pin in pins:
        if pin.model.family != pin.family:
            return (
                f"built-in model tables conflict: {pin.where()} lists a model of family "
                f"{pin.model.family!r}, which is not its own{suffix}"
            )
    for i, first in enumerate(pins):
        for second in pins[i + 1 :]:
            if first.model.repository == second.model.repository:
                what = f"repository {first.model.repository!r} is pinned by"
            elif first.model.name == second.model.name:
                what = f"the name {first.model.name!r} is taken by"
            else:
                continue
            return f"built-in model tables conflict: {what} {first.where()} and {second.where()}{suffix}"
    return None


def verify_files(model: BuiltinModel, package: ModelPackage) -> None:
    """Check every pinned file before load; PackageError names the first file that differs."""
    for relative, pinned in sorted(model.files.items()):
        path = package.path(relative)
        if not path.is_file():
            raise PackageError(
                f"built-in model {model.name!r}: file {relative!r} is missing from {str(package.root)!r}"
            )
        actual = sha256_file(path)
        if actual != pinned:
            raise PackageError(
                f"built-in model {model.name!r}: file {relative!r} has SHA-256 {actual}, but the table "
                f"pins {pinned}; the model is refused"
            )


def check_identity(model: BuiltinModel, verification: Verification) -> None:
    """After the family's `verify`: every file it loads is pinned, and the identities agree."""
    unpinned = sorted(set(verification.files) - set(model.files))
    if unpinned:
        raise PackageError(
            f"built-in model {model.name!r}: the family loads {unpinned[0]!r}, which its table does not pin"
        )
    for relative, digest in verification.files.items():
        if model.files[relative] != digest:
            raise PackageError(f"built-in model {model.name!r}: file {relative!r} differs from its pin")
    if verification.model_sha256 != model.model_sha256:
        raise PackageError(
            f"built-in model {model.name!r}: model_sha256 {verification.model_sha256} is not the pinned "
            f"{model.model_sha256}"
        )


def describe_tables(tables: Tables) -> list[dict[str, str]]:
    """Rows for `vllm-srun models`: one per built-in model, by name."""
    return [
        {
            "name": m.name,
            "family": m.family,
            "repository": m.repository,
            "revision": m.revision,
            "model_sha256": m.model_sha256,
            "licence": m.licence,
        }
        for _, m in sorted(tables.models.items())
    ]
