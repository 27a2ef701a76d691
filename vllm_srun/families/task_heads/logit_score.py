"""Causal-LM rerankers as sentence-transformers packages them (CrossEncoder with a
"text-generation" Transformer and a LogitScore module): the form Qwen3-Reranker ships in.

Each (query, document) pair is rendered through the package's chat template (jinja2's
immutable sandbox; a template that reads the clock is refused) and tokenized with no special
tokens added; the engine scores the last token as a one-label head. Over-long pairs are cut as
sentence-transformers cuts them, keeping the template's tail.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_srun.errors import PackageError
from vllm_srun.families.task_heads.cross_encoder import bound_prompt, resolve
from vllm_srun.families.task_heads.sentence import MODULES, SENTENCE_BERT_CONFIG, ST_CONFIG
from vllm_srun.families.task_heads.tokenize import SPECIAL, Encoded, _encoded
from vllm_srun.families.task_heads.windows import Overflow
from vllm_srun.plugins.architectures import declared
from vllm_srun.plugins.bodies import UnsupportedOption

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.plugins.surfaces import RerankRequest

HEAD = "logit_score"  # the table's head name for such classes (engines/native/heads.py)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# The named special tokens Transformers hands a template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# sentence-transformers' pair roles, in pair order, and the contents it renders to find the
# template's tail: the common end of the renders is template, never content.
ROLES = ("query", "document")
_TAIL_FILLERS = ("0", "1 2 3 4")
_TAILS_KEPT = 64  # the tails of this many prompts are kept (one render pair each to find again)
# Pairs whose renders must differ in the query and in the document: a template that drops a
# role would score a text without it (sentence-transformers refuses such a template too).
_ROLE_PROBES = (("alpha", "bravo"), ("charlie", "bravo"), ("alpha", "foxtrot"))
# apply_chat_template keywords that size the tokenization rather than reach the template.
_SIZE_KEYS = frozenset({"padding", "truncation", "max_length", "return_tensors"})
# Model types sentence-transformers knows to take flat message contents whatever the template.
_FLAT_MODEL_TYPES = frozenset({"apertus", "deepseek_v3", "gpt_oss", "seed_oss"})
# Template text that marks contents as lists of typed parts (sentence-transformers' test).
_STRUCTURED_MARKS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


def reads_logits(config: Mapping[str, Any]) -> bool:
    """Whether config.json declares a class the table serves by its LM head's logits (a causal
    LM, Qwen3ForCausalLM): served only in the LogitScore form, refused otherwise."""
    found = declared(config)
    return found is not None and found[0].head_of(found[1]) == HEAD


def is_logit_score(package: ModelPackage) -> bool:
    """Whether the package's modules.json names a LogitScore module (cheap: one small file)."""
    if not package.exists(MODULES):
        return False
    try:
        modules = package.read_json(MODULES)
    except PackageError:
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).rsplit(".", 1)[-1] == "LogitScore" for m in modules
    )


@dataclass(frozen=True, kw_only=True)
class LogitScoreConfig:
    """What a LogitScore package says about scoring a pair."""

    true_token_id: int
    false_token_id: int | None
    template: str
    message_format: str  # "flat" (a message's content is its text) or "structured" (typed parts)
    template_kwargs: dict[str, Any]  # special tokens and processing_kwargs' chat_template values
    restore_tail: bool  # processing_kwargs.chat_template.restore_suffix (true by default)
    prompts: dict[str, str]
    default_prompt_name: str | None
    max_seq_length: int | None
    config_files: tuple[str, ...]  # every file read here, for verify's digests

    @property
    def token_ids(self) -> list[int | None]:
        return [self.true_token_id, self.false_token_id]


def _json_object(package: ModelPackage, relative: str) -> dict[str, Any]:
    data = package.read_json(relative)
    if not isinstance(data, dict):
        raise PackageError(f"{relative} in {package.name!r} is not a JSON object")
    return data


def _token_id(value: Any, field: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PackageError(f"{where}: {field} must be a token id, not {value!r}")
    return value


def read_logit_score(package: ModelPackage, config: Mapping[str, Any]) -> LogitScoreConfig:
    """The package's LogitScore configuration; PackageError names the file or setting that
    cannot be served as sentence-transformers would serve it."""
    name = package.name
    modules = package.read_json(MODULES)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
    if kinds != ["Transformer", "LogitScore"] or len(modules) != 2:
        raise PackageError(
            f"{MODULES} in {name!r} has modules {kinds}; a LogitScore reranker is served as "
            "['Transformer', 'LogitScore'] (the causal LM, then the score of two logits)"
        )
    if str(modules[0].get("path") or ""):
        raise PackageError(f"{MODULES} in {name!r}: the Transformer must be the package root (path '')")
    files = [MODULES]
    head_config = f"{modules[1].get('path') or '1_LogitScore'!s}/config.json"
    head = _json_object(package, head_config)
    files.append(head_config)
    where = f"{head_config} in {name!r}"
    if head.get("module_input_name", "causal_logits") != "causal_logits":
        raise PackageError(
            f"{where}: module_input_name {head['module_input_name']!r} (only causal_logits is served)"
        )
    true_id = _token_id(head.get("true_token_id"), "true_token_id", where)
    false_raw = head.get("false_token_id")
    false_id = None if false_raw is None else _token_id(false_raw, "false_token_id", where)
    vocab = config.get("vocab_size")
    for field, token in (("true_token_id", true_id), ("false_token_id", false_id)):
        if token is not None and isinstance(vocab, int) and token >= vocab:
            raise PackageError(f"{where}: {field} {token} is outside the vocabulary (vocab_size {vocab})")
    settings: dict[str, Any] = {}
    if package.exists(SENTENCE_BERT_CONFIG):
        files.append(SENTENCE_BERT_CONFIG)
        settings = _json_object(package, SENTENCE_BERT_CONFIG)
    task = settings.get("transformer_task", "feature-extraction")
    if task != "text-generation":
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r}: transformer_task {task!r}; a LogitScore reranker "
            "reads a causal LM's logits ('text-generation')"
        )
    if settings.get("do_lower_case"):
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r}: do_lower_case is not served for a LogitScore reranker"
        )
    limit = settings.get("max_seq_length")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
        raise PackageError(f"{SENTENCE_BERT_CONFIG} in {name!r}: max_seq_length {limit!r}")
    modality = (settings.get("modality_config") or {}).get("message")
    if not isinstance(modality, dict):
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r} has no 'message' modality: sentence-transformers "
            "would tokenize the pair as two texts, not through a chat template; the LogitScore "
            "form is served through its chat template"
        )
    kwargs, restore_tail = _chat_template_kwargs(settings.get("processing_kwargs"), name)
    template, template_file = _template(package)
    files.append(template_file)
    tokenizer_settings = _json_object(package, TOKENIZER_CONFIG) if package.exists(TOKENIZER_CONFIG) else {}
    specials = _special_tokens(tokenizer_settings)
    message_format = str(modality.get("format", "auto"))
    if message_format == "auto":
        message_format = _infer_format(str(config.get("model_type", "")), template)
    if message_format not in ("flat", "structured"):
        raise PackageError(f"{SENTENCE_BERT_CONFIG} in {name!r}: message format {message_format!r}")
    prompts: dict[str, str] = {}
    default: str | None = None
    if package.exists(ST_CONFIG):
        files.append(ST_CONFIG)
        st = _json_object(package, ST_CONFIG)
        raw = st.get("prompts") or {}
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            raise PackageError(f"{ST_CONFIG} in {name!r}: prompts must map names to texts")
        prompts, default = dict(raw), st.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise PackageError(f"{ST_CONFIG} in {name!r}: default_prompt_name {default!r} is not a prompt")
    return LogitScoreConfig(
        true_token_id=true_id,
        false_token_id=false_id,
        template=template,
        message_format=message_format,
        template_kwargs={**specials, **kwargs},
        restore_tail=restore_tail,
        prompts=prompts,
        default_prompt_name=default,
        max_seq_length=limit,
        config_files=tuple(dict.fromkeys(files)),
    )


def _chat_template_kwargs(processing: Any, name: str) -> tuple[dict[str, Any], bool]:
    """processing_kwargs' `chat_template` values (template variables), and whether the tail is
    restored after truncation; any other processing setting is refused, naming it."""
    if not processing:
        return {}, True
    if not isinstance(processing, dict) or set(processing) - {"chat_template"}:
        extra = sorted(set(processing) - {"chat_template"}) if isinstance(processing, dict) else processing
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r}: processing_kwargs {extra!r} are not served for a "
            "LogitScore reranker (only chat_template values)"
        )
    values = dict(processing.get("chat_template") or {})
    restore = values.pop("restore_suffix", True)
    sized = sorted(_SIZE_KEYS & set(values))
    if sized:
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r}: processing_kwargs.chat_template {sized} are not served"
        )
    if not all(_plain(v) for v in values.values()):
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {name!r}: processing_kwargs.chat_template values must be JSON"
        )
    return values, bool(restore)


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _plain(v) for k, v in value.items())


def _template(package: ModelPackage) -> tuple[str, str]:
    """The chat template Transformers' tokenizer loads: chat_template.jinja over
    tokenizer_config.json's `chat_template` (its 'default' where it names several)."""
    if package.exists(CHAT_TEMPLATE_FILE):
        return package.read_bytes(CHAT_TEMPLATE_FILE).decode("utf-8"), CHAT_TEMPLATE_FILE
    settings = _json_object(package, TOKENIZER_CONFIG) if package.exists(TOKENIZER_CONFIG) else {}
    template = settings.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise PackageError(
            f"{package.name!r} has no chat template ({CHAT_TEMPLATE_FILE} or {TOKENIZER_CONFIG}'s "
            "chat_template): a LogitScore reranker formats each pair with one"
        )
    return template, TOKENIZER_CONFIG


def _special_tokens(settings: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in SPECIAL_TOKEN_NAMES:
        value = settings.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _infer_format(model_type: str, template: str) -> str:
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    return "structured" if any(mark in template for mark in _STRUCTURED_MARKS) else "flat"


class PairTemplate:
    """Formats and tokenizes (query, document) pairs as sentence-transformers does for one
    LogitScore package. Built once per loaded model; the template is checked then (it compiles
    in the sandbox, renders both roles, reads no clock), so a request never meets a template
    error."""

    def __init__(self, config: LogitScoreConfig, tokenizer: Tokenizer, *, model: str) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        if "strftime_now" in config.template:
            raise PackageError(
                f"the chat template of {model!r} reads the clock (strftime_now): its text, and so "
                "every score, would change with the date; it is not served"
            )
        try:
            self._compiled = _environment().from_string(config.template)
            renders = [self.render(q, d, "") for q, d in _ROLE_PROBES]
        except Exception as exc:  # jinja2's TemplateError, SecurityError, or what a template raises
            raise PackageError(
                f"the chat template of {model!r} cannot be rendered in the sandbox: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        dropped = [role for role, render in zip(ROLES, renders[1:], strict=True) if render == renders[0]]
        if dropped:
            raise PackageError(
                f"the chat template of {model!r} does not render the {' and '.join(dropped)} of a pair "
                "(sentence-transformers gives them the roles 'query' and 'document')"
            )
        self._tails: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def _message(self, role: str, text: str) -> dict[str, Any]:
        if self.config.message_format == "flat":
            return {"role": role, "content": text}
        return {"role": role, "content": [{"type": "text", "text": text}]}

    def render(self, query: str, document: str, prompt: str) -> str:
        """The text of one pair: a system message with `prompt` (none when empty), then the
        query and document messages, rendered with the package's template variables."""
        messages = [self._message("system", prompt)] if prompt else []
        messages += [self._message("query", query), self._message("document", document)]
        values: dict[str, Any] = {"tools": None, "documents": None, "add_generation_prompt": False}
        values.update(self.config.template_kwargs)
        return str(self._compiled.render(messages=messages, **values))

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def tail(self, prompt: str) -> list[int]:
        """The template's tokens after the document, as sentence-transformers derives them: the
        longest common token suffix of two renders whose contents differ (the system message
        kept); none when the renders never diverge."""
        if not self.config.restore_tail:
            return []
        with self._lock:  # plans run on several threads (the planner pool, bulk chunks)
            known = self._tails.get(prompt)
        if known is not None:
            return known
        first, second = self._ids([self._render(f, f, prompt, "prompt") for f in _TAIL_FILLERS])
        count = 0
        for left, right in zip(reversed(first), reversed(second), strict=False):
            if left != right:
                break
            count += 1
        tail = first[len(first) - count :] if 0 < count < min(len(first), len(second)) else []
        with self._lock:
            if len(self._tails) >= _TAILS_KEPT:  # raw prompts are the clients': keep a bounded few
                self._tails.pop(next(iter(self._tails)))
            self._tails[prompt] = tail
        return tail

    def _render(self, query: str, document: str, prompt: str, param: str) -> str:
        """`render`, with a template's refusal of one input (its raise_exception, or an error
        only some contents reach) answered as the model's refusal naming `param` (422)."""
        try:
            return self.render(query, document, prompt)
        except Exception as exc:  # whatever the template raises
            raise UnsupportedOption(
                f"{param}: the chat template of model {self.model!r} cannot render it: {type(exc).__name__}: {exc}",
                param=param,
            ) from exc

    def encode(
        self, pairs: Sequence[tuple[str, str | None]], params: Sequence[str], *, prompt: str, policy: Overflow
    ) -> list[Encoded]:
        """Each pair rendered and tokenized; the template's tail positions are marked special,
        so truncation keeps them as sentence-transformers restores them. Windows are refused (a
        window of the rendered text is no pair), and so is a text without its pair; a prompt
        longer than any input may be (windows.max_chars) is a RequestTooLarge naming it, before
        it is rendered into every pair."""
        bound_prompt(prompt, policy)
        if policy.mode == "window":
            raise UnsupportedOption(
                f"options.overflow: 'window' is not served for model {self.model!r}, which scores "
                "a pair by its chat template's last token; use 'truncate' or 'reject'",
                param="options.overflow",
            )
        for (_, pair), param in zip(pairs, params, strict=True):
            if pair is None:
                field = f"{param}.text_pair" if param.startswith("input") else param
                raise UnsupportedOption(
                    f"{field}: model {self.model!r} scores (query, document) pairs through its chat "
                    "template; give each input a text_pair",
                    param=field,
                )
        texts = [
            self._render(query, pair or "", prompt, param)
            for (query, pair), param in zip(pairs, params, strict=True)
        ]
        tail = self.tail(prompt)
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        out: list[Encoded] = []
        for encoding in encodings:
            enc = _encoded(encoding, False)
            ids = enc.ids.tolist()
            if tail and len(ids) > len(tail) and ids[-len(tail) :] == tail:
                seq = enc.seq.copy()
                seq[-len(tail) :] = SPECIAL
                enc = dataclasses.replace(enc, seq=seq)
            out.append(enc)
        return out

    def default_prompt(self) -> str:
        """The prompt of the package's default_prompt_name; "" for none."""
        name = self.config.default_prompt_name
        return "" if name is None else self.config.prompts[name]

    def prompt_of(self, request: RerankRequest) -> str:
        """The prompt a rerank request selects (cross_encoder.resolve); "" for none."""
        return resolve(self.config.prompts, self.config.default_prompt_name, request, model=self.model)


def _environment() -> Any:
    """jinja2's immutable sandbox with what Transformers gives a chat template: its whitespace
    settings, loop controls, `raise_exception`, a `tojson` that does not escape HTML, `dict`,
    and a `namespace` that refuses underscore names."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for key in attrs:
                Namespace.check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, key: str, value: Any) -> None:
            Namespace.check(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

        @staticmethod
        def check(key: Any) -> None:
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a namespace attribute may not start with '_' ({key!r})"
                )

    class Dict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, namespace=Namespace, dict=Dict())
    return env
