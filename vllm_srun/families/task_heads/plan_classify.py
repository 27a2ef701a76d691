"""Plans a classify request: one work item per input (more under the window policy), after
refusing options its head does not read."""

from __future__ import annotations

import msgspec

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.heads import SCORES, TOKEN
from vllm_srun.plugins.base import HeadInfo, Plan
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import ClassifyRequest, Options, texts_of

# The classify options only some heads read (finish.classify), by the head kinds that read them.
HEAD_OPTIONS = {"threshold": frozenset({TOKEN, SCORES}), "return_tokens": frozenset({TOKEN})}


def plan_classify(model: TaskHeadsBase, request: ClassifyRequest) -> Plan:
    head = model.head("classify", request.head_name(), "options.head" if request.head is None else "head")
    pairs = texts_of(request.input)
    if not pairs:
        raise InvalidRequest("input: must not be empty")
    if head.kind == TOKEN:
        for i, (_, pair) in enumerate(pairs):
            if pair is not None:
                raise UnsupportedOption(f"input[{i}].text_pair: the token head tags single texts")
    _refuse_unread(head, request.options)
    single = isinstance(request.input, str)
    return model.plan_pairs("classify", head, request.options, pairs, ["input"] if single else None)


def _refuse_unread(head: HeadInfo, options: Options) -> None:
    """An UnsupportedOption (422) naming a classify option `head` does not read: the surface takes it,
    but this head would answer as if it were unset."""
    given = msgspec.to_builtins(options)  # omit_defaults: only what the request set
    for option, kinds in HEAD_OPTIONS.items():
        if option in given and head.kind not in kinds:
            field = f"options.{option}"
            raise UnsupportedOption(  # the head's refusal, not the document's: 422
                f"{field}: the {head.kind} head {head.name!r} does not read it (only a "
                f"{' or '.join(sorted(kinds))} head does)",
                param=field,
            )
