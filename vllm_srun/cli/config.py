"""Model lists from files: `--models FILE` (ours, strict) and a router's `--config router.yaml`.

A `--models` file is ours, so an unknown key is an error naming it. A model's `name` is its id
(by default its reference's name: a directory's folder name, a repository's `org/name`) and
its `aliases` are further names requests may use; a router deployment says the same with
`model` (else its `name`) and `aliases`. A router configuration
belongs to the router: of it we read `global.model_catalog.deployments` (`CatalogDeployment`:
the router's description of a deployment, not the one a worker serves; a list of entries with
a `name`, or the router's mapping of name to entry), serve the entries with
`provider: model_runtime` and no `endpoint`, and check the ones with an `endpoint`. We also
read the router's decision signals (`routing.signals.decision`: a name, a deployment, else
`global.model_catalog.system.decision_model`'s, and one question, preset and set questions
included): each question must be well formed and bound to a `model_runtime` deployment, and
`check-config` asks each one of its endpoint, as the router will.
Every default comes from `vllm_srun.defaults`, as the command line's do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml

from vllm_srun import defaults
from vllm_srun.app.runtime import ModelSettings
from vllm_srun.client import http_options
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import EXACT_PROFILE, MAX_SPEED_PROFILE
from vllm_srun.plugins.decision_bodies import KNOWN_TYPES, QuestionInvalid, expand_preset, parse_question
from vllm_srun.plugins.decisions import DecisionModel
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.registry.loader import ModelOptions

PROVIDER = "model_runtime"
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


class ModelsFile(msgspec.Struct, forbid_unknown_fields=True):
    models: list[ModelEntry]


class CatalogDeployment(HowToServe, kw_only=True):
    """One entry of the router's `model_catalog.deployments`: where the router sends a model.

    The router's record, read to decide what to serve or check; what a device worker serves
    is `vllm_srun.queue.worker.device_worker.Deployment`. Keys we do not use are the router's business and
    are ignored.
    """

    name: str
    provider: str = ""
    artifact: str | None = None
    model: str | None = None
    endpoint: str | None = None
    revision: str | None = None
    aliases: list[str] = msgspec.field(default_factory=list)

    @property
    def served_name(self) -> str:
        return self.model or self.name

    def entry(self, artifact: str) -> ModelEntry:
        """This deployment as a `--models` entry serving `artifact` under its served name."""
        how = {f: getattr(self, f) for f in HowToServe.__struct_fields__}
        return ModelEntry(
            model=artifact, revision=self.revision, name=self.served_name, aliases=self.aliases, **how
        )


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
    )
    return ModelSettings(options=options, limits=BatchLimits(**msgspec.structs.asdict(entry.batching)))


def models_file(path: Path, *, allow_download: bool = False) -> list[ModelSettings]:
    parsed: ModelsFile = _convert(_load_yaml(path), ModelsFile, path)
    return [settings_of(e, allow_download=allow_download) for e in parsed.models]


def _router_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A router configuration and its `global.model_catalog` section."""
    raw = _load_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a router configuration is a mapping, not {type(raw).__name__}")
    section = raw.get("global")
    catalog = (section.get("model_catalog") if isinstance(section, dict) else None) or {}
    if not isinstance(catalog, dict):
        raise ConfigError(f"{path}: global.model_catalog must be a mapping")
    return raw, catalog


def router_deployments(path: Path) -> list[CatalogDeployment]:
    """The `model_runtime` deployments of a router configuration."""
    _, catalog = _router_config(path)
    entries = catalog.get("deployments")
    if isinstance(entries, dict):  # the router's own form: {name: deployment}
        entries = [{**e, "name": e.get("name", n)} for n, e in entries.items() if isinstance(e, dict)]
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: global.model_catalog.deployments must be a list or a mapping of names")
    deployments = [_convert(e, CatalogDeployment, path) for e in entries if isinstance(e, dict)]
    return [d for d in deployments if d.provider == PROVIDER]


@dataclass(frozen=True)
class DecisionSignal:
    """One of the router's decision signals: a question it asks a runtime deployment."""

    name: str
    deployment: CatalogDeployment
    question: dict[str, Any]


def decision_signals(path: Path) -> list[DecisionSignal]:
    """The router's `routing.signals.decision` entries, each question checked for what needs no
    model (its fields; a preset's name and its type's questions the served model checks) and
    bound to a `model_runtime` deployment; a ConfigError names the signal and the field."""
    raw, catalog = _router_config(path)
    routing = raw.get("routing")
    signals = routing.get("signals") if isinstance(routing, dict) else None
    entries = signals.get("decision") if isinstance(signals, dict) else None
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: routing.signals.decision must be a list")
    system = catalog.get("system")
    default = system.get("decision_model") if isinstance(system, dict) else None
    default_name = default.get("deployment") if isinstance(default, dict) else None
    deployments = {d.name: d for d in router_deployments(path)}
    out = []
    for i, entry in enumerate(entries):
        where = f"routing.signals.decision[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{path}: {where}: a decision signal is a mapping with a name")
        name = entry["name"]
        bound = entry.get("deployment", default_name)
        if bound not in deployments:
            known = ", ".join(deployments) or "none"
            raise ConfigError(
                f"{path}: {where} ({name}): deployment {bound!r} is not a model_runtime deployment "
                f"(they are: {known})"
            )
        question = entry.get("question")
        try:
            check_question(question, f"{where}.question")
        except QuestionInvalid as exc:
            raise ConfigError(f"{path}: {name}: {exc}") from exc
        assert isinstance(question, dict)  # check_question refuses anything else
        out.append(DecisionSignal(name=name, deployment=deployments[bound], question=question))
    return out


def check_question(question: Any, path: str) -> None:
    """What a question's own text says is wrong with it, of any type a model may declare; a
    preset is checked for the fields it may carry (the model says whether it has it)."""
    if isinstance(question, dict) and "preset" in question:
        fake = {question["preset"]: {"type": question.get("type", "set"), "instructions": "-"}}
        expanded = expand_preset(question, fake, path)
        if "threshold" in expanded:
            _threshold_of(expanded, path)
        return
    parse_question("q", question, path, types=KNOWN_TYPES)


def signal_checks(path: Path) -> dict[str, Callable[[LoadedModel], None]]:
    """By served model name, the check `serve --config` runs on each model it serves itself
    once loaded: the decision signals bound to its deployment (see `check_served_signals`)."""
    bound: dict[str, list[DecisionSignal]] = {}
    for signal in decision_signals(path):
        if not signal.deployment.endpoint:
            bound.setdefault(signal.deployment.served_name, []).append(signal)
    return {name: partial(check_served_signals, path, signals) for name, signals in bound.items()}


def check_served_signals(path: Path, signals: Sequence[DecisionSignal], model: LoadedModel) -> None:
    """Whether `model` answers each of `signals`' questions, read as /v1/decisions reads them
    (its presets, its question types); a ConfigError naming the first signal it would answer
    with invalid_question. `decision_signals` checked what needs no model; a preset's name and
    type, and a type the model may not declare, need it."""
    for signal in signals:
        where = f"{path}: decision signal {signal.name!r} (deployment {signal.deployment.name!r})"
        if not isinstance(model, DecisionModel):
            raise ConfigError(f"{where}: model {model.info.name!r} does not answer decisions")
        try:
            raw = expand_preset(signal.question, dict(model.presets), "question")
            parse_question(signal.name, raw, "question", types=model.question_types)
        except QuestionInvalid as exc:
            raise ConfigError(f"{where}: {exc}") from exc


def _threshold_of(question: dict[str, Any], path: str) -> None:
    value = question["threshold"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise QuestionInvalid(f"{path}.threshold: must be a number in [0, 1]")


def router_models(path: Path, *, allow_download: bool = False) -> list[ModelSettings]:
    """What `serve --config` serves: the runtime deployments that name no endpoint (after the
    router's decision signals are checked, so a malformed question stops the start)."""
    decision_signals(path)
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
    """For each deployment with an endpoint (`http(s)://` or `unix:///path.sock`): is its model
    served there, on its device?"""
    checks = []
    for d in router_deployments(path):
        if not d.endpoint:
            continue
        url = d.endpoint.rstrip("/") + "/v1/models"
        try:
            with httpx.Client(**http_options(d.endpoint, api_key, timeout_s)) as http:
                response = http.get("/v1/models")
            response.raise_for_status()
            served = _by_name(response.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            checks.append(Check(d.name, d.endpoint, False, f"cannot read {url}: {exc}"))
            continue
        checks.append(_judge(d, served))
    return checks


def check_signals(
    path: Path, *, timeout_s: float = defaults.CHECK_TIMEOUT_S, api_key: str | None = None
) -> list[Check]:
    """For each decision signal bound to a deployment with an endpoint: does that runtime
    answer its question? It is asked once, about a fixed state, as the router will ask it; an
    unknown preset or a question type the model does not declare fails as it would there."""
    checks = []
    for signal in decision_signals(path):
        d = signal.deployment
        if not d.endpoint:
            continue
        url = d.endpoint.rstrip("/") + "/v1/decisions"
        body = {"model": d.served_name, "state": "check-config", "questions": {signal.name: signal.question}}
        label = f"decision {signal.name}"
        try:
            with httpx.Client(**http_options(d.endpoint, api_key, timeout_s)) as http:
                response = http.post("/v1/decisions", json=body)
            answered = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            checks.append(Check(label, d.endpoint, False, f"cannot ask {url}: {exc}"))
            continue
        checks.append(_judge_answer(label, d, signal.name, response.status_code, answered))
    return checks


def _judge_answer(label: str, d: CatalogDeployment, name: str, status: int, body: Any) -> Check:
    assert d.endpoint is not None
    if status != 200 or not isinstance(body, dict):
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = error.get("message", body) if isinstance(error, dict) else body
        return Check(label, d.endpoint, False, f"{d.served_name!r} refused it ({status}): {message}")
    answer = body.get("answers", {}).get(name)
    if isinstance(answer, dict) and answer.get("error"):
        return Check(label, d.endpoint, False, f"{answer['error']}: {answer.get('message', '')}")
    kind = "set" if name in (body.get("sets") or {}) else (answer or {}).get("type", "?")
    return Check(label, d.endpoint, True, f"{d.served_name!r} answers it ({kind})")


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
