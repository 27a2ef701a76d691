"""The example family's built-in table: models `vllm-srun serve NAME` finds by name.

A family points at this module with `builtin_table = "vllm_sr_example.table"`. Each entry pins
a Hugging Face repository at one commit, the SHA-256 of every file the family loads, and
answers recorded per device class, which the runtime checks while the model warms up.

The one entry here is exactly what `vllm_sr_example.fixtures.write_fixture(out)` writes, so
the example can be tried without the Hub: place that package in the Hugging Face cache as
`models--vllm-sr-example--keywords/snapshots/<revision>/` (the tests do).
"""

from __future__ import annotations

from vllm_srun.registry.tables import BuiltinModel, GoldenRecord

MODELS = [
    BuiltinModel(
        name="example-keywords",
        repository="vllm-sr-example/keywords",
        revision="3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39",
        family="example_keywords",
        # combined_sha256(files): the identity the family's verify() computes.
        model_sha256="f7ad345180db4b5ef0463554765232145ce6310272e090844e043662b33d2d78",
        files={"example_model.json": "aca8ad576c0a9f52f7990bec814774e2c171472b3f87cfce796f7c44910ac351"},
        licence="Apache-2.0",
        description="Keyword routing between billing, shipping and other.",
        golden={
            # The counts engine is exact, so one record serves every device class it runs on.
            device: [
                GoldenRecord(
                    surface="classify",
                    request={"input": ["Please refund the invoice", "Where is my parcel?"]},
                    expected={
                        "labels": ["billing", "shipping", "other"],
                        "results": [
                            {"label": "billing", "probabilities": [0.736125, 0.099624, 0.164252]},
                            {"label": "shipping", "probabilities": [0.186324, 0.506480, 0.307196]},
                        ],
                    },
                ),
                GoldenRecord(
                    surface="embeddings",
                    request={"input": "refund parcel"},
                    expected={"data": [{"embedding": [0.0, 0.0, 0.0, 0.707107, 0.707107]}]},
                ),
            ]
            for device in ("cpu", "example_host")
        },
    )
]
