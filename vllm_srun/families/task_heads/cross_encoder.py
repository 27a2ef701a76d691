"""Prompts of pair scorers (cross-encoders), applied as sentence-transformers'
`CrossEncoder.predict` applies them.

Prompts are read only where `CrossEncoder(path)` reads them (modules.json and a
config_sentence_transformers.json of `model_type` "CrossEncoder"). A raw prompt applies to any
cross-encoder, a prompt name only to one that has it; the prompt goes before the first text of
each pair. A bi-encoder's rerank takes no pair prompt (`refuse_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_srun.errors import InvalidRequest, PackageError, RequestTooLarge
from vllm_srun.families.task_heads.sentence import MODULES, ST_CONFIG, read_prompts
from vllm_srun.families.task_heads.windows import Overflow, max_chars
from vllm_srun.plugins.bodies import UnsupportedOption

if TYPE_CHECKING:
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.plugins.surfaces import RerankRequest

CROSS_ENCODER = "CrossEncoder"  # config_sentence_transformers.json's model_type


def resolve(
    prompts: dict[str, str], default_prompt_name: str | None, request: RerankRequest, *, model: str
) -> str:
    """The prompt a rerank request selects: `prompt` as given, `prompt_name` from `prompts`,
    else the default's; "" for none. Both given is an InvalidRequest (400); a name the package
    lacks is the model's refusal (422), naming its prompts."""
    if request.prompt is not None and request.prompt_name is not None:
        raise InvalidRequest("prompt_name: give one of prompt and prompt_name, not both", param="prompt_name")
    if request.prompt is not None:
        return request.prompt
    name = request.prompt_name or default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        known = ", ".join(repr(p) for p in prompts) or "none"
        raise UnsupportedOption(
            f"prompt_name: model {model!r} has no prompt named {name!r}; its prompts: {known}",
            param="prompt_name",
        )
    return prompts[name]


def bound_prompt(prompt: str, policy: Overflow) -> None:
    """A prompt longer than any input may be (windows.max_chars) is a RequestTooLarge (413)
    naming it, before it is put into every pair."""
    if len(prompt) > max_chars(policy):
        raise RequestTooLarge(
            f"prompt: {len(prompt)} characters; at most {max_chars(policy)} are read for a budget "
            f"of {policy.max_tokens} tokens",
            param="prompt",
        )


def refuse_prompt(request: RerankRequest, model: str) -> None:
    """A rerank prompt asked of a model that scores no pairs (a bi-encoder): its refusal (422)."""
    for name in ("prompt", "prompt_name"):
        if getattr(request, name) is not None:
            raise UnsupportedOption(
                f"{name}: model {model!r} embeds the query and each document apart and takes no "
                "rerank prompt (a cross-encoder puts it before the query of each pair, as "
                "CrossEncoder.predict does)",
                param=name,
            )


@dataclass(frozen=True)
class PairPrompts:
    """A cross-encoder's prompts, as `CrossEncoder(path)` reads them (none for a package it
    reads none from); `config_files` are the files read, for verify's digests."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    config_files: tuple[str, ...] = ()

    def default_prompt(self) -> str:
        """The prompt every pair gets when a request names none; "" for none."""
        return "" if self.default_prompt_name is None else self.prompts[self.default_prompt_name]

    def prompt_of(self, request: RerankRequest, *, model: str) -> str:
        return resolve(self.prompts, self.default_prompt_name, request, model=model)


def read_pair_prompts(package: ModelPackage) -> PairPrompts:
    """The prompts `CrossEncoder(package)` applies: those of a CrossEncoder's
    config_sentence_transformers.json beside a modules.json, else none."""
    if not (package.exists(MODULES) and package.exists(ST_CONFIG)):
        return PairPrompts()
    files = (MODULES, ST_CONFIG)
    data = package.read_json(ST_CONFIG)
    if not isinstance(data, dict):
        raise PackageError(f"{ST_CONFIG} in {package.name!r} is not a JSON object")
    if data.get("model_type") != CROSS_ENCODER:
        return PairPrompts(config_files=files)  # loaded as a new CrossEncoder: its prompts unread
    settings = read_prompts(package)
    return PairPrompts(
        prompts=settings["prompts"], default_prompt_name=settings["default_prompt_name"], config_files=files
    )
