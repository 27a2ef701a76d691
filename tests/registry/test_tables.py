"""Built-in model tables: import, conflicts, file verification, and the example plugin's table."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import pytest
import structlog
from vllm_sr_example.family import KeywordFamily

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.base import ModelFamily, Verification
from vllm_srun.plugins.package import ModelPackage, combined_sha256, sha256_file
from vllm_srun.registry.tables import (
    BuiltinModel,
    check_identity,
    describe_tables,
    load_tables,
    verify_files,
)

_counter = itertools.count()
DIGEST = "ab" * 32
REVISION = "0123456789abcdef0123456789abcdef01234567"


class TabledKeywords(KeywordFamily):
    """The example family with its table named, as the example plugin declares it."""

    name = "example_keywords"
    builtin_table = "vllm_sr_example.table"


class StubFamily(ModelFamily):
    def __init__(self, name: str, table: str | None) -> None:
        self.name = name  # type: ignore[misc]
        self.builtin_table = table  # type: ignore[misc]

    def detect(self, package: Any) -> bool:
        return False

    def verify(self, package: Any) -> Any:
        raise NotImplementedError

    def describe(self, package: Any) -> Any:
        raise NotImplementedError

    def load(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def entry(name: str, repository: str, family: str) -> str:
    files = {"model.json": DIGEST}
    return (
        f"BuiltinModel(name={name!r}, repository={repository!r}, revision={REVISION!r}, family={family!r}, "
        f"model_sha256={combined_sha256(files)!r}, files={files!r}, licence='MIT')"
    )


def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """A table module on sys.path, under a fresh name (imported modules are cached)."""
    name = f"srun_test_table_{next(_counter)}"
    (tmp_path / f"{name}.py").write_text(
        "from vllm_srun.registry.tables import BuiltinModel, GoldenRecord\n" + textwrap.dedent(body)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_the_example_table_pins_what_its_fixture_writer_writes(tmp_path: Path) -> None:
    from vllm_sr_example.fixtures import write_fixture

    tables = load_tables([TabledKeywords()])
    assert tables.conflict is None and not tables.skipped
    model = tables.models["example-keywords"]
    package = write_fixture(tmp_path / "kw")
    assert dict(model.files) == {"example_model.json": sha256_file(package / "example_model.json")}
    verify_files(model, ModelPackage(package))
    verification = TabledKeywords().verify(ModelPackage(package))
    assert verification.model_sha256 == model.model_sha256
    check_identity(model, verification)
    assert set(model.golden) == {"cpu", "example_host"}


def test_describe_tables_lists_pins() -> None:
    rows = describe_tables(load_tables([TabledKeywords()]))
    assert rows == [
        {
            "name": "example-keywords",
            "family": "example_keywords",
            "repository": "vllm-sr-example/keywords",
            "revision": "3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39",
            "model_sha256": "f7ad345180db4b5ef0463554765232145ce6310272e090844e043662b33d2d78",
            "licence": "Apache-2.0",
        }
    ]


def test_a_tampered_or_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    from vllm_sr_example.fixtures import write_fixture

    model = load_tables([TabledKeywords()]).models["example-keywords"]
    package = write_fixture(tmp_path / "kw")
    (package / "example_model.json").write_text((package / "example_model.json").read_text() + " ")
    with pytest.raises(
        PackageError, match=r"file 'example_model.json' has SHA-256 [0-9a-f]{64}, but the table"
    ):
        verify_files(model, ModelPackage(package))
    (package / "example_model.json").unlink()
    with pytest.raises(PackageError, match=r"file 'example_model\.json' is missing"):
        verify_files(model, ModelPackage(package))


def test_a_file_the_family_loads_must_be_pinned() -> None:
    model = load_tables([TabledKeywords()]).models["example-keywords"]
    files = {**model.files, "extra.json": DIGEST}
    verification = Verification(model_sha256=combined_sha256(files), files=files)
    with pytest.raises(PackageError, match=r"loads 'extra\.json', which its table does not pin"):
        check_identity(model, verification)


def test_two_tables_pinning_one_repository_refuse_every_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = table(tmp_path, monkeypatch, f"MODELS = [{entry('one', 'org/shared', 'alpha')}]")
    second = table(tmp_path, monkeypatch, f"MODELS = [{entry('two', 'org/shared', 'beta')}]")
    tables = load_tables([StubFamily("alpha", first), StubFamily("beta", second), TabledKeywords()])
    assert tables.conflict is not None
    assert first in tables.conflict and second in tables.conflict and "'org/shared'" in tables.conflict
    with pytest.raises(ConfigError, match="every model is refused"):
        tables.check()


def test_a_table_listing_another_familys_model_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = table(tmp_path, monkeypatch, f"MODELS = [{entry('stolen', 'org/stolen', 'beta')}]")
    tables = load_tables([StubFamily("alpha", module), StubFamily("beta", None)])
    assert tables.conflict is not None
    assert module in tables.conflict and "family alpha" in tables.conflict and "'beta'" in tables.conflict
    with pytest.raises(ConfigError):
        tables.check()


def test_a_table_that_fails_to_import_pins_nothing_and_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = table(tmp_path, monkeypatch, "import not_a_module_anywhere\nMODELS = []\n")
    bad_entry = entry("bad", "org/bad", "beta").replace(REVISION, "main")
    malformed = table(tmp_path, monkeypatch, f"MODELS = [{bad_entry}]")
    good = table(tmp_path, monkeypatch, f"MODELS = [{entry('fine', 'org/fine', 'gamma')}]")
    families = [StubFamily("alpha", broken), StubFamily("beta", malformed), StubFamily("gamma", good)]
    with structlog.testing.capture_logs() as logs:
        tables = load_tables(families)
    assert tables.conflict is None
    assert list(tables.models) == ["fine"]
    assert [(s.family, s.module) for s in tables.skipped] == [("alpha", broken), ("beta", malformed)]
    assert "not_a_module_anywhere" in tables.skipped[0].reason
    assert "not a 40-hex commit" in tables.skipped[1].reason
    skipped = [e for e in logs if e["event"] == "builtin_table_skipped"]
    assert [e["table"] for e in skipped] == [broken, malformed]
    assert all(e["log_level"] == "warning" and e["reason"] for e in skipped)


def test_entries_must_be_consistent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong_identity = entry("x", "org/x", "alpha").replace(combined_sha256({"model.json": DIGEST}), "0" * 64)
    module = table(tmp_path, monkeypatch, f"MODELS = [{wrong_identity}]")
    tables = load_tables([StubFamily("alpha", module)])
    assert not tables.models and "model_sha256 is not the combined digest" in tables.skipped[0].reason
    assert isinstance(BuiltinModel, type)
