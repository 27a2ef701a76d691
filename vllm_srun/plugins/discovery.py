"""Entry-point discovery of families, engines, accelerators, metrics sinks and architectures.

Built-ins register through the same entry points; loading is once per process. `VLLM_SRUN_PLUGINS=a,b`
loads only those names; a name two distributions claim refuses the start; a class of the wrong
base is refused; a plugin that fails to import is logged and skipped. An entry point in
`vllm_srun.architectures` names an `Architecture` row, registered in the architecture table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import structlog

from vllm_srun.errors import ConfigError, PluginConflict
from vllm_srun.plugins.architectures import Architecture, register_architecture
from vllm_srun.plugins.base import Accelerator, Engine, ModelFamily, Plugin
from vllm_srun.plugins.stats import StatLoggerBase

log = structlog.get_logger("vllm_srun.plugins")

ALLOW_ENV = "VLLM_SRUN_PLUGINS"

GROUPS: dict[str, tuple[str, type[Plugin]]] = {
    "families": ("vllm_srun.families", ModelFamily),
    "engines": ("vllm_srun.engines", Engine),
    "accelerators": ("vllm_srun.accelerators", Accelerator),
    "stat_loggers": ("vllm_srun.stat_loggers", StatLoggerBase),
}

# Rows of the architecture table shipped by distributions: instances, not classes.
ARCHITECTURES = ("architectures", "vllm_srun.architectures")

_SINGULAR = {
    "families": "family",
    "engines": "engine",
    "accelerators": "accelerator",
    "stat_loggers": "stat logger",
    "architectures": "architecture",
}


@dataclass(frozen=True)
class PluginEntry:
    """One loaded plugin: its instance and where it came from."""

    group: str
    name: str
    target: str
    distribution: str
    version: str
    plugin: Any

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "target": self.target,
            "descriptor": self.plugin.descriptor(),
        }


@dataclass(frozen=True)
class RefusedPlugin:
    group: str
    name: str
    distribution: str
    reason: str


@dataclass
class Plugins:
    """The plugins of this process, by group and name."""

    groups: dict[str, dict[str, PluginEntry]] = field(default_factory=dict)
    refused: list[RefusedPlugin] = field(default_factory=list)

    def of(self, group: str) -> dict[str, PluginEntry]:
        return self.groups.get(group, {})

    def get(self, group: str, name: str) -> Any:
        entries = self.of(group)
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise ConfigError(
                f"no {_SINGULAR.get(group, group)} named {name!r} is installed (known: {known})"
            )
        return entries[name].plugin

    def family(self, name: str) -> ModelFamily:
        plugin: ModelFamily = self.get("families", name)
        return plugin

    def engine(self, name: str) -> Engine:
        plugin: Engine = self.get("engines", name)
        return plugin

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            group: [entry.describe() for _, entry in sorted(self.of(group).items())]
            for group in (*GROUPS, ARCHITECTURES[0])
        }
        out["refused"] = [vars(r) for r in self.refused]
        return out


_loaded: Plugins | None = None


def allowed_names() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    if not raw:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def _distribution(ep: EntryPoint) -> tuple[str, str]:
    dist = ep.dist
    if dist is None:
        return "unknown", "unknown"
    return dist.metadata["Name"] or dist.name, dist.version


def _unique(eps: Iterable[EntryPoint]) -> dict[str, list[EntryPoint]]:
    """Entry points by name; the same distribution seen twice on sys.path counts once."""
    by_name: dict[str, list[EntryPoint]] = {}
    for ep in eps:
        seen = by_name.setdefault(ep.name, [])
        if all(_distribution(other)[0] != _distribution(ep)[0] for other in seen):
            seen.append(ep)
    return by_name


def _sole(group: str, name: str, eps: list[EntryPoint]) -> EntryPoint:
    """The one entry point of `name`; PluginConflict naming both when two distributions claim it."""
    if len(eps) > 1:
        claimants = " and ".join(sorted(f"{_distribution(ep)[0]} ({ep.value})" for ep in eps))
        raise PluginConflict(f"the {_SINGULAR.get(group, group)} name {name!r} is claimed by {claimants}")
    return eps[0]


def _entries(group: str, ep_group: str, allow: set[str] | None) -> Iterator[tuple[str, EntryPoint, str, str]]:
    """(name, entry point, distribution, version) of each allowed plugin of `ep_group`, by name;
    PluginConflict when two distributions claim one name."""
    for name, eps in sorted(_unique(entry_points(group=ep_group)).items()):
        if allow is None or name in allow:
            ep = _sole(group, name, eps)
            yield (name, ep, *_distribution(ep))


def _skip(out: Plugins, group: str, name: str, dist: str, reason: str, *, refused: bool = False) -> None:
    """Log a plugin left out (a warning; an error when `refused`: it is not what its group loads)."""
    emit = log.error if refused else log.warning
    emit("plugin_refused" if refused else "plugin_skipped", group=group, plugin=name, distribution=dist, reason=reason)
    out.refused.append(RefusedPlugin(group, name, dist, reason))


def _load_group(group: str, ep_group: str, base: type[Plugin], allow: set[str] | None, out: Plugins) -> None:
    entries: dict[str, PluginEntry] = {}
    for name, ep, dist, version in _entries(group, ep_group, allow):
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not stop the others
            _skip(out, group, name, dist, f"import failed: {type(exc).__name__}: {exc}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, base)):
            reason = f"{ep.value} is not a subclass of {base.__module__}.{base.__name__}"
            _skip(out, group, name, dist, reason, refused=True)
            continue
        try:
            plugin = cls()
        except Exception as exc:
            _skip(out, group, name, dist, f"construction failed: {type(exc).__name__}: {exc}")
            continue
        plugin.name = name  # type: ignore[misc]  # the registered name wins over the class default
        entries[name] = PluginEntry(group, name, ep.value, dist, version, plugin)
    out.groups[group] = entries


def _load_architectures(allow: set[str] | None, out: Plugins) -> None:
    group, ep_group = ARCHITECTURES
    entries: dict[str, PluginEntry] = {}
    for name, ep, dist, version in _entries(group, ep_group, allow):
        try:
            row = ep.load()
            if not isinstance(row, Architecture):
                raise TypeError(f"{ep.value} is not a vllm_srun.plugins.architectures.Architecture")
            register_architecture(row)  # idempotent: loading twice registers the same row
        except Exception as exc:  # a broken plugin must not stop the others
            _skip(out, group, name, dist, f"{type(exc).__name__}: {exc}")
            continue
        entries[name] = PluginEntry(group, name, ep.value, dist, version, row)
    out.groups[group] = entries


def load_plugins(*, reload: bool = False) -> Plugins:
    """The plugins of this process; discovered on first call and cached after."""
    global _loaded
    if _loaded is not None and not reload:
        return _loaded
    allow = allowed_names()
    plugins = Plugins()
    # Architectures first: a family's detection reads the table they add to.
    _load_architectures(allow, plugins)
    for group, (ep_group, base) in GROUPS.items():
        _load_group(group, ep_group, base, allow, plugins)
    _loaded = plugins
    return plugins
