"""A local package's default id: the name it gives its model, its folder name an alias."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_sr_example.fixtures import write_fixture

from vllm_srun.app.loading import unclaimed_aliases
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.registry.loader import ModelOptions, prepare
from vllm_srun.registry.names import own_name
from vllm_srun.registry.resolve import resolve
from vllm_srun.registry.tables import Tables

CARD = """---
# For reference on model card metadata, see the spec
library_name: sentence-transformers
---

# all-MiniLM-L6-v2
This is a sentence-transformers model.
"""


def package(tmp_path: Path, files: dict[str, str], folder: str = "model") -> ModelPackage:
    root = tmp_path / folder
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return ModelPackage(root)


@pytest.mark.parametrize(
    ("files", "name"),
    [
        # A sentence-transformers package: its card's title, not config.json's base model.
        (
            {"modules.json": "[]", "README.md": CARD, "config.json": '{"_name_or_path": "org/base"}'},
            "all-MiniLM-L6-v2",
        ),
        (
            {"modules.json": "[]", "README.md": "# sentence-transformers/all-mpnet-base-v2\n"},
            "all-mpnet-base-v2",
        ),
        # sentence-transformers' title for a model it has no name for is several words.
        ({"modules.json": "[]", "README.md": "---\nx: 1\n---\n# Cross Encoder model\n"}, None),
        # A code block's comment is not a title.
        ({"modules.json": "[]", "README.md": "```\n# install\n```\n# late-title\n"}, None),
        ({"modules.json": "[]"}, None),
        # Any other package: config.json's _name_or_path basename, when it is a Hub id.
        (
            {"config.json": json.dumps({"_name_or_path": "protectai/deberta-v3-base-prompt-injection-v2"})},
            "deberta-v3-base-prompt-injection-v2",
        ),
        ({"config.json": json.dumps({"_name_or_path": "bert-base-uncased"})}, "bert-base-uncased"),
        ({"config.json": json.dumps({"_name_or_path": "/home/me/runs/out"})}, None),
        ({"config.json": json.dumps({"_name_or_path": ""})}, None),
        ({"config.json": "[1]"}, None),
        ({"config.json": "{not json"}, None),
        ({}, None),
    ],
)
def test_own_name(tmp_path: Path, files: dict[str, str], name: str | None) -> None:
    assert own_name(package(tmp_path, files)) == name


def test_a_folder_is_served_under_its_models_name_with_the_folder_as_alias(tmp_path: Path) -> None:
    # The keyword family reads its own file; config.json here only names the model.
    root = write_fixture(tmp_path / "model")
    (root / "config.json").write_text(json.dumps({"_name_or_path": "acme/keywords-v2"}))
    plugins = load_plugins()
    prepared = prepare(plugins, Tables(), ModelOptions(ref=str(root)), with_engine=False)
    assert (prepared.name, prepared.aliases) == ("keywords-v2", ("model",))
    # --served-model-name wins, and takes no alias of its own.
    named = prepare(plugins, Tables(), ModelOptions(ref=str(root), name="kw"), with_engine=False)
    assert (named.name, named.aliases) == ("kw", ())
    # Without a name of its own, a folder keeps serving under the folder's.
    plain = resolve(str(write_fixture(tmp_path / "plain")), tables=Tables())
    assert (plain.name, plain.aliases) == ("plain", ())


def test_a_folder_name_two_models_share_is_neither_ones_alias(tmp_path: Path) -> None:
    plugins = load_plugins()
    prepared = []
    for owner in ("a", "b"):
        root = write_fixture(tmp_path / owner / "model")
        (root / "config.json").write_text(json.dumps({"_name_or_path": f"acme/{owner}"}))
        prepared.append(prepare(plugins, Tables(), ModelOptions(ref=str(root)), with_engine=False))
    assert [p.aliases for p in prepared] == [("model",), ("model",)]
    assert [p.aliases for p in unclaimed_aliases(prepared, [])] == [(), ()]
    # One alone keeps it, unless another model is named so.
    assert unclaimed_aliases(prepared[:1], [])[0].aliases == ("model",)
    assert unclaimed_aliases(prepared[:1], ["model"])[0].aliases == ()
