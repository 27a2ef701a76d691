"""The built-in rows of the architecture table: one `Architecture` per network the native
engine runs. Adding an architecture is one module under `vllm_srun/engines/native/` and one row
here (a plugin ships its row through the `vllm_srun.architectures` entry point instead).
"""

from __future__ import annotations

from vllm_srun.plugins.architecture import Architecture, Fixture, encoder_classes

_NATIVE = "vllm_srun.engines.native"


BUILTIN: tuple[Architecture, ...] = (
    Architecture(
        name="bert",
        model_types=("bert",),
        target=f"{_NATIVE}.bert:Bert",
        classes=encoder_classes(("Bert",), "pooler", extra=("ForPreTraining",)),
        type_ids=True,
        fixtures={"bert": Fixture(config_class="BertConfig", class_prefix="Bert", tokenizer="wordpiece")},
        sparse_head="bert_mlm",
    ),
    Architecture(
        name="modernbert",
        model_types=("modernbert",),
        target=f"{_NATIVE}.modernbert:ModernBert",
        classes=encoder_classes(("ModernBert",), "modernbert", "modernbert_token"),
        fast_paths=("dense",),
        fixtures={
            flavour: Fixture(
                config_class="ModernBertConfig",
                class_prefix="ModernBert",
                tokenizer=tokenizer,
                # The Hub spelling of the layer pattern, which Transformers 5 turns into layer_types.
                settings={"global_attn_every_n_layers": 2, "local_attention": 8},
                special_ids=("pad", "bos", "eos", "cls", "sep"),
                hub_config={
                    "global_attn_every_n_layers": 2,
                    "global_rope_theta": 160000.0,
                    "local_rope_theta": 10000.0,
                },
            )
            for flavour, tokenizer in (("modernbert", "bytelevel"), ("mmbert", "unigram"))
        },
    ),
    Architecture(
        name="roberta",
        model_types=("roberta", "xlm-roberta", "camembert"),
        target=f"{_NATIVE}.roberta:Roberta",
        classes=encoder_classes(("Roberta", "XLMRoberta", "Camembert"), "dense"),
        position_offset=True,
        fixtures={
            flavour: Fixture(
                config_class=f"{prefix}Config",
                class_prefix=prefix,
                tokenizer=tokenizer,
                # One token type, as the released checkpoints have (the config classes default to 2).
                settings={"type_vocab_size": 1},
                special_ids=("pad", "bos", "eos"),
            )
            for flavour, prefix, tokenizer in (
                ("roberta", "Roberta", "bytelevel"),
                ("xlm-roberta", "XLMRoberta", "unigram"),
                ("camembert", "Camembert", "unigram"),
            )
        },
    ),
    Architecture(
        name="electra",
        model_types=("electra",),
        target=f"{_NATIVE}.electra:Electra",
        classes=encoder_classes(("Electra",), "dense_gelu", extra=("ForPreTraining",)),
        type_ids=True,
        fixtures={
            # embedding_size below hidden_size, as the released ELECTRA-small has: embeddings_project runs.
            "electra": Fixture(
                config_class="ElectraConfig",
                class_prefix="Electra",
                tokenizer="wordpiece",
                settings={"embedding_size": 16},
            )
        },
    ),
    Architecture(
        name="distilbert",
        model_types=("distilbert",),
        target=f"{_NATIVE}.distilbert:DistilBert",
        classes=encoder_classes(("DistilBert",), "pre_classifier"),
        sparse_head="distilbert_mlm",
        config_keys={
            "hidden_size": "dim",
            "num_hidden_layers": "n_layers",
            "num_attention_heads": "n_heads",
            "intermediate_size": "hidden_dim",
        },
        fixtures={
            # DistilBertConfig maps hidden_size/num_hidden_layers/num_attention_heads onto its own
            # names but not intermediate_size: hidden_dim is DistilBERT's own spelling of it.
            "distilbert": Fixture(
                config_class="DistilBertConfig",
                class_prefix="DistilBert",
                tokenizer="wordpiece",
                settings={"hidden_dim": 64},
            )
        },
    ),
    Architecture(
        name="deberta-v2",
        model_types=("deberta-v2",),
        target=f"{_NATIVE}.deberta_v2:DebertaV2",
        classes=encoder_classes(("DebertaV2",), "context_pooler"),
        type_ids=True,  # v2 has two token types; v3's type_vocab_size 0 sends none
        fast_paths=("dense",),  # the relative bias is built from the block width: no ONNX export
        fixtures={
            # DeBERTa-v3: no absolute positions, no token types, log buckets (8 < the parity
            # rows' 40 tokens) over max_relative_positions 16, shared keys, normalised table.
            "deberta-v3": Fixture(
                config_class="DebertaV2Config",
                class_prefix="DebertaV2",
                tokenizer="unigram",
                settings={
                    "type_vocab_size": 0,
                    "position_biased_input": False,
                    "relative_attention": True,
                    "pos_att_type": ["p2c", "c2p"],
                    "share_att_key": True,
                    "position_buckets": 8,
                    "max_relative_positions": 16,
                    "norm_rel_ebd": "layer_norm",
                },
            ),
            # DeBERTa-v2: absolute positions too, two token types, unbucketed distances clamped
            # at 16, separate position projections, and a narrower embedding through embed_proj.
            "deberta-v2": Fixture(
                config_class="DebertaV2Config",
                class_prefix="DebertaV2",
                tokenizer="wordpiece",
                settings={
                    "type_vocab_size": 2,
                    "position_biased_input": True,
                    "relative_attention": True,
                    "pos_att_type": ["c2p", "p2c"],
                    "share_att_key": False,
                    "max_relative_positions": 16,
                    "embedding_size": 16,
                },
            ),
        },
    ),
    Architecture(
        name="mpnet",
        model_types=("mpnet",),
        target=f"{_NATIVE}.mpnet:MPNet",
        classes=encoder_classes(("MPNet",), "dense"),
        fast_paths=("dense",),  # relative-position bias: no fixed-shape graph to trace
        position_offset=True,
        fixtures={
            "mpnet": Fixture(
                config_class="MPNetConfig",
                class_prefix="MPNet",
                tokenizer="wordpiece",
                # Transformers' MPNet pads at index 1 whatever the tokenizer says (real MPNet
                # vocabularies put <pad> there): the config says so, and its table holds
                # 2 + the fixtures' positions.
                settings={"pad_token_id": 1, "max_position_embeddings": 130},
                special_ids=("pad", "bos", "eos"),
            )
        },
    ),
    Architecture(
        name="qwen3",
        model_types=("qwen3",),
        target=f"{_NATIVE}.qwen3:Qwen3",
        # Decoders served as encoders: Qwen3-Embedding (a bare Qwen3Model with last-token
        # pooling), one-label rerankers, token taggers, and causal LMs read as yes/no
        # rerankers, which the family serves only as sentence-transformers LogitScore packages
        # (`CONVERT` otherwise).
        classes={
            "Qwen3Model": ("model", None),
            "Qwen3ForSequenceClassification": ("sequence", "last_token_score"),
            "Qwen3ForTokenClassification": ("token", "score_token"),
            "Qwen3ForCausalLM": ("sequence", "logit_score"),
        },
        fast_paths=("dense",),  # rotary
        fixtures={
            # Heads x head_dim (64) differs from hidden_size (32), as in Qwen3-0.6B (16 x 128
            # against 1024); a non-default theta, so a reader that ignores it fails. "qwen3-eot-pad"
            # pads with the <|endoftext|> its tokenizer appends, as Qwen's tokenizers do: the
            # reference classifier then scores the token before it.
            flavour: Fixture(
                config_class="Qwen3Config",
                class_prefix="Qwen3",
                tokenizer=tokenizer,
                settings={"num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1000.0},
                special_ids=("pad", "bos", "eos"),
                hub_config={"rope_theta": 1000.0, "rope_scaling": None},
            )
            for flavour, tokenizer in (("qwen3", "bytelevel_eot"), ("qwen3-eot-pad", "bytelevel_eot_pad"))
        },
    ),
    Architecture(
        name="nomic-bert",
        model_types=("nomic_bert",),
        target=f"{_NATIVE}.nomic_bert:NomicBert",
        classes=encoder_classes(("NomicBert",), "pooler"),
        type_ids=True,
        fast_paths=("dense",),  # rotary: no dynamic-shape ONNX trace
        # The Hub's nomic-embed-text configs keep the remote code's GPT-2 spellings.
        config_keys={
            "hidden_size": "n_embd",
            "num_hidden_layers": "n_layer",
            "num_attention_heads": "n_head",
            "intermediate_size": "n_inner",
            "max_position_embeddings": "n_positions",
        },
        fixtures={
            "nomic-bert": Fixture(
                config_class="NomicBertConfig",
                class_prefix="NomicBert",
                tokenizer="wordpiece",
                # A theta other than the class default, so the one read from config.json counts.
                settings={"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
            )
        },
    ),
    Architecture(
        name="gte",
        model_types=("gte",),
        target=f"{_NATIVE}.gte:Gte",
        classes=encoder_classes(("Gte",), "pooler"),
        type_ids=True,  # gte-large-en-v1.5 has two token types; others one or none
        fast_paths=("dense",),  # rotary: no dynamic-shape ONNX trace
        fixtures={
            "gte": Fixture(
                config_class="GteConfig",
                class_prefix="Gte",
                tokenizer="wordpiece",
                settings={"rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}},
            )
        },
    ),
)
