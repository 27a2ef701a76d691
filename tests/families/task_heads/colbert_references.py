"""PyLate ColBERT packages for the tests, and their reference vectors.

`write_pylate` turns a tiny random embedder fixture (BERT or ModernBERT) into the form PyLate
saves: the Pooling and Normalize modules replaced by a PyLate Dense module (a random Linear to
`DIM`, no bias, in 1_Dense/model.safetensors), the "[Q] " and "[D] " tokens added to the
tokenizer with embedding rows of their own, and PyLate's settings in
config_sentence_transformers.json. `colbert_reference` computes what
`pylate.models.ColBERT(path).encode` gives, from Transformers by PyLate's steps (pylate itself
does not install beside torch 2.13.0: it pins transformers<=5.3 and brings torch 2.11), the
numbers the served vectors must equal (ATOL). Shared by
tests/families/task_heads/test_colbert.py and tests/app/test_colbert.py.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np

ATOL = 1e-5
DIM = 16
QUERY_LENGTH = 12
DOCUMENT_LENGTH = 24
# Punctuation the word-piece fixture lacks ("~", "^") is an unknown token, which the default
# skiplist then drops too (PyLate maps a word the vocabulary lacks to the unknown id).
TEXTS = [
    "good",
    "John Smith lives in Paris, and works at Google.",
    "what a terrible movie ! i hate it ~ the movie ^ the end",
    "Mary visited London, Berlin and New York City last year with her dog and cat; then Paris and Rome.",
]
QUERY = "who lives in paris?"


def write_pylate(
    out: Path,
    *,
    backbone: str = "bert",
    attend_to_expansion_tokens: bool = False,
    do_query_expansion: bool = True,
    seed: int = 7,
) -> Path:
    """A PyLate package of the `backbone` fixture ("bert" or "modernbert") in `out`."""
    import torch
    import transformers
    from safetensors.torch import save_file
    from tokenizers import AddedToken, Tokenizer

    from vllm_srun.testing.task_heads_fixtures import write_fixture

    out = Path(out)
    write_fixture(out, variant=f"{backbone}-embedding")
    for module in out.iterdir():
        if module.is_dir() and module.name[:2] in ("1_", "2_"):
            shutil.rmtree(module)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken("[Q] ", normalized=True), AddedToken("[D] ", normalized=True)])
    tokenizer.save(str(out / "tokenizer.json"))
    settings = json.loads((out / "tokenizer_config.json").read_text())
    settings.update(
        tokenizer_class="PreTrainedTokenizerFast",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    model = transformers.AutoModel.from_pretrained(str(out), dtype=torch.float32)
    if backbone == "modernbert":
        # A sliding window that reaches a key from every expansion token (as 128 does for
        # GTE-ModernColBERT's 32-token queries): one that does not leaves that token's attention
        # row with no key, where Transformers' eager, its SDPA and this engine all differ.
        model.config.local_attention = 2 * QUERY_LENGTH
    model.resize_token_embeddings(tokenizer.get_vocab_size(with_added_tokens=True))
    model.save_pretrained(str(out), safe_serialization=True)
    hidden = model.config.hidden_size
    dense = out / "1_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": hidden,
                "out_features": DIM,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
                "use_residual": False,
            }
        )
    )
    generator = torch.Generator().manual_seed(seed)
    save_file({"linear.weight": torch.randn(DIM, hidden, generator=generator) * 0.2}, str(dense / "model.safetensors"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False}))
    config = {
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": QUERY_LENGTH,
        "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": attend_to_expansion_tokens,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": do_query_expansion,
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2))
    return out


def colbert_reference(path: Path, texts: list[str], *, is_query: bool) -> list[np.ndarray]:
    """The vectors `pylate.models.ColBERT(path).encode(texts, is_query=...)` gives, computed
    from Transformers (eager attention, float32) by PyLate's steps: the tokenizer truncates to
    the length less the prefix (and pads a query with the mask token to it, for expansion), the
    prefix id goes in after the first token with attention 1, a query's attention mask is all
    ones when it attends to its expansion tokens, the Dense weights project every token, a
    document keeps the tokens that are neither padding nor in the skiplist (each word's
    convert_tokens_to_ids), a query every token (only the unpadded ones without expansion),
    and each vector is L2-normalised."""
    import torch
    import transformers
    from safetensors.torch import load_file

    config = json.loads((path / "config_sentence_transformers.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModel.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()
    weight = load_file(str(path / "1_Dense" / "model.safetensors"))["linear.weight"]
    length = config["query_length"] if is_query else config["document_length"]
    prefix = tokenizer.convert_tokens_to_ids(config["query_prefix"] if is_query else config["document_prefix"])
    expand = is_query and config["do_query_expansion"]
    tokenizer.pad_token = tokenizer.mask_token  # PyLate pads with the mask token
    batch = tokenizer(
        texts, padding="max_length" if expand else True, truncation="longest_first", max_length=length - 1, return_tensors="pt"
    )

    def insert(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([x[:, :1], torch.full((x.shape[0], 1), value, dtype=x.dtype), x[:, 1:]], dim=1)

    ids, mask = insert(batch["input_ids"], prefix), insert(batch["attention_mask"], 1)
    if expand and config["attend_to_expansion_tokens"]:
        mask = torch.ones_like(mask)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    projected = hidden @ weight.T
    if is_query:
        keep = torch.ones_like(ids, dtype=torch.bool) if expand else mask.bool()
    else:
        skiplist = torch.tensor([tokenizer.convert_tokens_to_ids(w) for w in config["skiplist_words"]])
        keep = mask.bool() & ~torch.isin(ids, skiplist)
    return [torch.nn.functional.normalize(projected[r][keep[r]], dim=-1).numpy() for r in range(len(texts))]


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """PyLate's colbert_scores_pairwise for one pair: the sum over query vectors of the best
    dot product with a document vector."""
    return float((query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1).sum())
