"""A router's configuration (`--config router.yaml`): what of it we serve and what we check.

The file belongs to the router; of it we read `global.model_catalog.deployments` (a list, or the
router's mapping of name to entry) and `routing.signals.decision`. We serve the
`provider: model_runtime` deployments that name no `endpoint`; `check-config` asks the ones that
do. Each decision signal's question must be well formed and bound to a `model_runtime` deployment
(its own, else `global.model_catalog.system.decision_model`'s); keys we do not use are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from vllm_srun.app.settings import ModelSettings
from vllm_srun.cli.config import HowToServe, ModelEntry, convert, load_yaml, settings_of
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.decision_questions import KNOWN_TYPES, QuestionInvalid, expand_preset, parse_question
from vllm_srun.plugins.decisions import DecisionModel

PROVIDER = "model_runtime"


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


def _router_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A router configuration and its `global.model_catalog` section."""
    raw = load_yaml(path) or {}
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
    deployments = [convert(e, CatalogDeployment, path) for e in entries if isinstance(e, dict)]
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
