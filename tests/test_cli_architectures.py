"""`vllm-srun models --architectures`: what loads natively, read from the architecture table."""

from __future__ import annotations

import json

from helpers import run_cli

from vllm_srun.plugins.architectures import architectures


def test_models_architectures_lists_every_row_and_class() -> None:
    out = run_cli("models", "--architectures", "--json", check=True, timeout=60)
    rows = {row["name"]: row for row in json.loads(out.stdout)["architectures"]}
    for arch in architectures():
        assert rows[arch.name]["model_types"] == list(arch.model_types)
        assert rows[arch.name]["classes"] == {cls: kind for cls, (kind, _) in arch.classes.items()}
    assert rows["bert"]["classes"]["BertForTokenClassification"] == "token"
    text = run_cli("models", "--architectures", check=True, timeout=60).stdout
    assert "ModernBertForSequenceClassification" in text and "onnx/model.onnx" in text
