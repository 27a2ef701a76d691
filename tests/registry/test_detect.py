"""Which family serves a package, and why none does when none does."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.registry.loader import detect_family


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (b"{not json", "'config.json' in .* is not valid JSON"),
        (b"\xff\xfe{}", "'config.json' in .* is not valid JSON"),
        (b'["bert"]', "config.json is a JSON list, not an object"),
    ],
)
def test_no_family_says_what_is_wrong_with_config_json(tmp_path: Path, config: bytes, reason: str) -> None:
    (tmp_path / "config.json").write_bytes(config)
    with pytest.raises(ConfigError, match=f"no installed family recognises .*; {reason}"):
        detect_family(load_plugins(), ModelPackage(tmp_path))


def test_no_family_and_no_config_says_only_that(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError) as error:
        detect_family(load_plugins(), ModelPackage(tmp_path))
    assert error.value.message.endswith(")")  # the families listed, nothing about config.json


def test_no_family_names_what_each_looks_for(tmp_path: Path) -> None:
    """An empty folder: each installed family says which files it looks for; a third-party
    family that does not say (the example's keyword family) is listed as not saying."""
    plugins = load_plugins()
    with pytest.raises(ConfigError) as error:
        detect_family(plugins, ModelPackage(tmp_path))
    message = error.value.message
    assert message.startswith(f"no installed family recognises {str(tmp_path.resolve())!r} (")
    for name, entry in plugins.of("families").items():
        looks_for = entry.plugin.looks_for or "files it does not name"
        assert f"{name} looks for {looks_for}" in message
    assert "task_heads looks for config.json naming an architecture it serves" in message
    assert "beside *.safetensors weights" in message and "onnx/model.onnx" in message
    assert "nli_decisions looks for config.json of a sequence classifier" in message
    assert "example_keywords looks for files it does not name" in message
