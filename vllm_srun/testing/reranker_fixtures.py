"""Reranker packages written by sentence-transformers itself: a Qwen3-style LogitScore reranker
(`write_logit_score_reranker`) and a BERT cross-encoder with prompts (`write_cross_encoder`)."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_srun.testing.task_heads_fixtures import SEED, _config, write_fixture
from vllm_srun.testing.tokenizer_fixtures import TOKENIZERS

# A Qwen3-Reranker-style chat template in the fixture vocabulary: the instruction is the system
# message's content when a prompt is given (sentence-transformers sends it as one), else a
# default; then the query, the document, and the assistant's empty thinking block, after which
# the model's next token (yes or no) is scored.
LOGIT_SCORE_TEMPLATE = """<|im_start|>system
is the document relevant to the query ? answer yes or no<|im_end|>
<|im_start|>user
{% set ns = namespace(instruction="find the document that answers the query") %}
{% for message in messages if message.role == "system" %}{% set ns.instruction = message.content %}{% endfor %}
<Instruct>: {{ ns.instruction }}
<Query>: {{ (messages | selectattr("role", "eq", "query") | first).content }}
<Document>: {{ (messages | selectattr("role", "eq", "document") | first).content }}<|im_end|>
<|im_start|>assistant
<think>

</think>

"""
# Room for the template and a pair of the tests' random texts.
LOGIT_SCORE_POSITIONS = 256


def write_logit_score_reranker(
    out: Path,
    *,
    tied: bool = True,
    false_token: str | None = "no",
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """Write a tiny random Qwen3ForCausalLM as sentence-transformers 6 saves a yes/no-logit
    CrossEncoder (Qwen3-Reranker's form): built with sentence-transformers itself from a
    Transformer (transformer_task "text-generation") and a LogitScore module scoring the "yes"
    token against `false_token` (None: the "yes" logit alone), with `LOGIT_SCORE_TEMPLATE` as
    its chat template and `prompts`. `tied` shares the LM head with the input embeddings, as
    Qwen3-0.6B does (no lm_head tensor is saved). Needs torch and sentence-transformers;
    reads nothing from the network. Returns `out`."""
    import tempfile

    import torch
    import transformers
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    out = Path(out)
    tok, vocab_size, ids = TOKENIZERS["bytelevel_eot"]()
    config = _config("qwen3", vocab_size, ids)
    config.architectures = ["Qwen3ForCausalLM"]
    config.tie_word_embeddings = tied
    config.max_position_embeddings = LOGIT_SCORE_POSITIONS
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch)
        torch.manual_seed(SEED)
        transformers.Qwen3ForCausalLM(config).eval().save_pretrained(str(raw), safe_serialization=True)
        tok.save(str(raw / "tokenizer.json"))
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": LOGIT_SCORE_POSITIONS,
            "pad_token": "[PAD]",
            "eos_token": "<|im_end|>",
            "chat_template": LOGIT_SCORE_TEMPLATE,
        }
        (raw / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        transformer = Transformer(str(raw), transformer_task="text-generation")
        vocab = transformer.tokenizer.get_vocab()
        score = LogitScore(
            true_token_id=vocab["yes"], false_token_id=None if false_token is None else vocab[false_token]
        )
        model = CrossEncoder(
            modules=[transformer, score],
            prompts=prompts,
            default_prompt_name=default_prompt_name,
            device="cpu",
        )
        model.save(str(out))
    return out


def write_cross_encoder(
    out: Path,
    *,
    variant: str = "bert-reranker",
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """Write the reranker `variant` (a one-label *ForSequenceClassification fixture) as
    sentence-transformers 6 saves a CrossEncoder of it with `prompts` and `default_prompt_name`:
    built with sentence-transformers itself (modules.json, config_sentence_transformers.json,
    the checkpoint and tokenizer as it saves them). Needs torch and sentence-transformers; reads
    nothing from the network. Returns `out`."""
    import tempfile

    from sentence_transformers import CrossEncoder

    with tempfile.TemporaryDirectory() as scratch:
        raw = write_fixture(Path(scratch) / variant, variant=variant)
        model = CrossEncoder(str(raw), prompts=prompts, default_prompt_name=default_prompt_name, device="cpu")
        model.save(str(out))
    return Path(out)
