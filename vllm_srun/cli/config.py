"""Models from a `--models FILE` (ours, strict: an unknown key is an error naming it).

`settings_of` is the one way a described model (a MODEL argument, a `--models` entry, a router
deployment) becomes the ModelSettings the server runs. A model's `name` is its id (by default its
reference's name) and its `aliases` are further names requests may use. Every default comes from
`vllm_srun.defaults`, as the command line's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml

from vllm_srun import defaults
from vllm_srun.app.settings import ModelSettings
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.bodies import EXACT_PROFILE, MAX_SPEED_PROFILE
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.registry.bounds import check_overrides
from vllm_srun.registry.loader import ModelOptions

# A model's profiles, as the router's `profile` names them, and whether each is --max-speed:
# `exact` is the float32 reference; `max_speed` the opt-in approximate numerics, which a model
# that cannot match float32 with them refuses at load.
PROFILES = {EXACT_PROFILE: False, MAX_SPEED_PROFILE: True}


class Batching(msgspec.Struct, forbid_unknown_fields=True):
    """A model's `batching:` section; what it leaves out is `vllm_srun.defaults`'."""

    max_num_seqs: int = defaults.MAX_NUM_SEQS
    max_num_batched_tokens: int = defaults.MAX_NUM_BATCHED_TOKENS
    batch_wait_ms: float = defaults.BATCH_WAIT_MS


class HowToServe(msgspec.Struct, kw_only=True):
    """How to serve a model, said the same way by a `--models` entry and a router deployment."""

    family: str | None = None
    engine: str = defaults.ENGINE
    device: str = defaults.DEVICE
    dtype: str = defaults.DTYPE
    max_speed: bool = False
    # The router's word for the numerics: `exact` or `max_speed` (PROFILES); "" leaves them
    # to `max_speed`, as no profile does.
    profile: str | None = None
    batching: Batching = msgspec.field(default_factory=Batching)


class ModelEntry(HowToServe, kw_only=True, forbid_unknown_fields=True):
    """One model of a `--models` file: ours in YAML, or the router's JSON (JSON is YAML), whose
    entries are `{"model", "revision"?, "name", "device", "profile"}`."""

    model: str
    revision: str | None = None
    name: str | None = None
    aliases: list[str] = msgspec.field(default_factory=list)
    # The twin check's bounds the operator sets, by the names /v1/models reports.
    bounds: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelsFile(msgspec.Struct, forbid_unknown_fields=True):
    models: list[ModelEntry]


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {exc}") from exc


def convert(value: Any, kind: type[Any], path: Path) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _max_speed(entry: ModelEntry) -> bool:
    """Whether `entry` asks for approximate numerics, by `max_speed` or by its `profile`."""
    if not entry.profile:
        return entry.max_speed
    if entry.profile not in PROFILES:
        raise ConfigError(
            f"model {entry.model!r}: profile {entry.profile!r} is not one of its profiles "
            f"({', '.join(PROFILES)})"
        )
    wanted = PROFILES[entry.profile]
    if entry.max_speed and not wanted:
        raise ConfigError(f"model {entry.model!r}: profile {entry.profile!r} contradicts max_speed: true")
    return wanted


def _reference(entry: ModelEntry) -> str:
    """The model reference with its revision: `org/name@revision`, as MODEL is written."""
    if entry.revision is None:
        return entry.model
    if "@" in entry.model:
        raise ConfigError(
            f"model {entry.model!r}: give the revision in the reference or in revision, not both"
        )
    return f"{entry.model}@{entry.revision}"


def settings_of(entry: ModelEntry, *, allow_download: bool = False) -> ModelSettings:
    """The one way a described model becomes what the server runs."""
    options = ModelOptions(
        ref=_reference(entry),
        name=entry.name,
        aliases=tuple(entry.aliases),
        family=entry.family,
        engine=entry.engine,
        device=entry.device,
        dtype=entry.dtype,
        allow_download=allow_download,
        max_speed=_max_speed(entry),
        bounds=check_overrides(entry.bounds, field=f"model {entry.model!r}: bounds"),
    )
    return ModelSettings(options=options, limits=BatchLimits(**msgspec.structs.asdict(entry.batching)))


def models_file(path: Path, *, allow_download: bool = False) -> list[ModelSettings]:
    parsed: ModelsFile = convert(load_yaml(path), ModelsFile, path)
    return [settings_of(e, allow_download=allow_download) for e in parsed.models]
