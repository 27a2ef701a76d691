"""The native implementation of "acme-bert": vllm-srun's BERT, under the checkpoint prefix `acme`.

Imported by the native engine only when it loads an acme-bert package (it needs torch).
"""

from vllm_srun.engines.native.bert import Bert


class AcmeBert(Bert):
    prefix = "acme"
