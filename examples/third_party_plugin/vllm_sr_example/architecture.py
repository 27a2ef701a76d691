"""A row of vllm-srun's architecture table for a model type the runtime does not know.

"acme-bert" checkpoints are BERT networks saved under the prefix `acme.` with their own
`model_type`: the row makes the built-in families serve them (classify, embeddings, rerank,
decisions) and the native engine run them with `vllm_sr_example.acme:AcmeBert`, which it
imports only when it first loads one. Shipping the row is all it takes: the entry point in
`vllm_srun.architectures` registers it in every process that loads plugins.
"""

from vllm_srun.plugins.architectures import Architecture

ACME_BERT = Architecture(
    name="acme-bert",
    model_types=("acme-bert",),
    target="vllm_sr_example.acme:AcmeBert",
    classes={
        "AcmeBertModel": ("model", None),
        "AcmeBertForSequenceClassification": ("sequence", "pooler"),
        "AcmeBertForTokenClassification": ("token", "token"),
    },
    type_ids=True,
)
