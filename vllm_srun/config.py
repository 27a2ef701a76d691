"""Model lists from files: `--models FILE` (ours, strict) and a router's `--config router.yaml`.

A `--models` file is ours, so an unknown key is an error naming it. A model's `name` is its id
(by default its reference's name: a directory's folder name, a repository's `org/name`) and
its `aliases` are further names requests may use; a router deployment says the same with
`model` (else its `name`) and `aliases`. A router configuration
belongs to the router: of it we read `global.model_catalog.deployments` (`CatalogDeployment`:
the router's description of a deployment, not the one a worker serves), serve the entries
with `provider: model_runtime` and no `endpoint`, and check the ones with an `endpoint`.
Every default comes from `vllm_srun.defaults`, as the command line's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml

from vllm_srun import defaults
from vllm_srun.app.runtime import ModelSettings
from vllm_srun.errors import ConfigError
from vllm_srun.queue.coalescer import BatchLimits
from vllm_srun.registry.loader import ModelOptions

PROVIDER = "model_runtime"


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
    batching: Batching = msgspec.field(default_factory=Batching)


class ModelEntry(HowToServe, kw_only=True, forbid_unknown_fields=True):
    """One model of a `--models` file."""

    model: str
    name: str | None = None
    aliases: list[str] = msgspec.field(default_factory=list)


class ModelsFile(msgspec.Struct, forbid_unknown_fields=True):
    models: list[ModelEntry]


class CatalogDeployment(HowToServe, kw_only=True):
    """One entry of the router's `model_catalog.deployments`: where the router sends a model.

    The router's record, read to decide what to serve or check; what a device worker serves
    is `vllm_srun.queue.worker.Deployment`. Keys we do not use are the router's business and
    are ignored.
    """

    name: str
    provider: str = ""
    artifact: str | None = None
    model: str | None = None
    endpoint: str | None = None
    aliases: list[str] = msgspec.field(default_factory=list)

    @property
    def served_name(self) -> str:
        return self.model or self.name

    def entry(self, artifact: str) -> ModelEntry:
        """This deployment as a `--models` entry serving `artifact` under its served name."""
        how = {f: getattr(self, f) for f in HowToServe.__struct_fields__}
        return ModelEntry(model=artifact, name=self.served_name, aliases=self.aliases, **how)


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {exc}") from exc


def _convert(value: Any, kind: type[Any], path: Path) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def settings_of(entry: ModelEntry, *, allow_download: bool = False) -> ModelSettings:
    """The one way a described model becomes what the server runs."""
    options = ModelOptions(
        ref=entry.model,
        name=entry.name,
        aliases=tuple(entry.aliases),
        family=entry.family,
        engine=entry.engine,
        device=entry.device,
        dtype=entry.dtype,
        allow_download=allow_download,
        max_speed=entry.max_speed,
    )
    return ModelSettings(options=options, limits=BatchLimits(**msgspec.structs.asdict(entry.batching)))


def models_file(path: Path, *, allow_download: bool = False) -> list[ModelSettings]:
    parsed: ModelsFile = _convert(_load_yaml(path), ModelsFile, path)
    return [settings_of(e, allow_download=allow_download) for e in parsed.models]


def router_deployments(path: Path) -> list[CatalogDeployment]:
    """The `model_runtime` deployments of a router configuration."""
    raw = _load_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a router configuration is a mapping, not {type(raw).__name__}")
    section = raw.get("global")
    catalog = (section.get("model_catalog") if isinstance(section, dict) else None) or {}
    if not isinstance(catalog, dict):
        raise ConfigError(f"{path}: global.model_catalog must be a mapping")
    entries = catalog.get("deployments")
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: global.model_catalog.deployments must be a list")
    deployments = [_convert(e, CatalogDeployment, path) for e in entries if isinstance(e, dict)]
    return [d for d in deployments if d.provider == PROVIDER]


def router_models(path: Path, *, allow_download: bool = False) -> list[ModelSettings]:
    """What `serve --config` serves: the runtime deployments that name no endpoint."""
    out = []
    for d in router_deployments(path):
        if d.endpoint:
            continue
        if not d.artifact:
            raise ConfigError(f"{path}: deployment {d.name!r} has neither an endpoint nor an artifact")
        out.append(settings_of(d.entry(d.artifact), allow_download=allow_download))
    return out


@dataclass(frozen=True)
class Check:
    deployment: str
    endpoint: str
    ok: bool
    detail: str


def check_endpoints(
    path: Path, *, timeout_s: float = defaults.CHECK_TIMEOUT_S, api_key: str | None = None
) -> list[Check]:
    """For each deployment with an endpoint: is its model served there, on its device?"""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    checks = []
    for d in router_deployments(path):
        if not d.endpoint:
            continue
        url = d.endpoint.rstrip("/") + "/v1/models"
        try:
            response = httpx.get(url, timeout=timeout_s, headers=headers)
            response.raise_for_status()
            served = _by_name(response.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            checks.append(Check(d.name, d.endpoint, False, f"cannot read {url}: {exc}"))
            continue
        checks.append(_judge(d, served))
    return checks


def _by_name(models: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """/v1/models' entries by id and by each alias (an alias reaches its model there too)."""
    out = {alias: m for m in models for alias in m.get("aliases") or []}
    return {**out, **{m["id"]: m for m in models}}


def _judge(d: CatalogDeployment, served: dict[str, dict[str, Any]]) -> Check:
    assert d.endpoint is not None
    available = ", ".join(
        f"{name} on {m.get('device', '?')} ({m.get('state', '?')})"
        for name, m in served.items()
        if name == m["id"]
    )
    model = served.get(d.served_name)
    if model is None:
        return Check(
            d.name,
            d.endpoint,
            False,
            f"{d.served_name!r} is not served there; it serves: {available or 'nothing'}",
        )
    device = str(model.get("device", ""))
    if d.device != "auto" and device.partition(":")[0] != d.device.partition(":")[0]:
        return Check(
            d.name,
            d.endpoint,
            False,
            f"{d.served_name!r} runs on {device}, not {d.device}; it serves: {available}",
        )
    if model.get("state") != "ready":
        return Check(
            d.name, d.endpoint, False, f"{d.served_name!r} is {model.get('state')}: {model.get('reason', '')}"
        )
    return Check(d.name, d.endpoint, True, f"{d.served_name!r} is ready on {device}")
