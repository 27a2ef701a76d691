"""Model resolution: local directories, the Hugging Face cache layout, built-in names.

The cache is built in tmp_path the way huggingface_hub lays it out: files stored once under
`blobs/`, each snapshot a folder of relative symlinks, `refs/main` naming a commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cache_package
from vllm_sr_example.family import KeywordFamily
from vllm_sr_example.fixtures import write_fixture

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.registry.resolve import hub_cache_dir, resolve
from vllm_srun.registry.tables import Tables, load_tables

REV_A = "a" * 40
REV_B = "b" * 40
PINNED = "3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39"  # the example table's revision


class TabledKeywords(KeywordFamily):
    name = "example_keywords"
    builtin_table = "vllm_sr_example.table"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return root


@pytest.fixture
def keywords_variants(tmp_path: Path) -> dict[str, Path]:
    return {v: write_fixture(tmp_path / "src" / v, variant=v) for v in ("default", "short")}


NO_TABLES = Tables()


def test_cache_dir_follows_the_hugging_face_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"


def test_a_local_directory_is_its_own_package(keywords_variants: dict[str, Path]) -> None:
    resolved = resolve(str(keywords_variants["default"]), tables=NO_TABLES)
    assert resolved.package.root == keywords_variants["default"].resolve() and resolved.builtin is None


def test_a_repository_id_resolves_through_refs_main(cache: Path, keywords_variants: dict[str, Path]) -> None:
    cache_package(cache, "acme/router-kw", REV_A, keywords_variants["short"], main=False)
    snapshot = cache_package(cache, "acme/router-kw", REV_B, keywords_variants["default"])
    resolved = resolve("acme/router-kw", tables=NO_TABLES)
    assert resolved.package.root == snapshot.resolve()
    assert (resolved.repository, resolved.revision, resolved.package.name) == (
        "acme/router-kw",
        REV_B,
        "router-kw",
    )
    # Files are links into blobs/; the family reads and hashes them like any package.
    family = KeywordFamily()
    assert family.detect(resolved.package)
    local = family.verify(ModelPackage(keywords_variants["default"]))
    assert family.verify(resolved.package).model_sha256 == local.model_sha256


def test_at_revision_pins_a_snapshot(cache: Path, keywords_variants: dict[str, Path]) -> None:
    short = cache_package(cache, "acme/kw", REV_A, keywords_variants["short"], main=False)
    cache_package(cache, "acme/kw", REV_B, keywords_variants["default"])
    resolved = resolve(f"acme/kw@{REV_A}", tables=NO_TABLES)
    assert resolved.package.root == short.resolve() and resolved.revision == REV_A
    assert resolve("acme/kw@main", tables=NO_TABLES).revision == REV_B
    missing = "c" * 40
    with pytest.raises(ConfigError, match=f"models--acme--kw/snapshots/{missing}"):
        resolve(f"acme/kw@{missing}", tables=NO_TABLES)
    with pytest.raises(ConfigError, match="neither a 40-hex commit nor a ref"):
        resolve("acme/kw@bad rev!", tables=NO_TABLES)


def test_a_single_snapshot_without_refs_main_is_used(cache: Path, keywords_variants: dict[str, Path]) -> None:
    snapshot = cache_package(cache, "acme/only", REV_A, keywords_variants["default"], main=False)
    assert resolve("acme/only", tables=NO_TABLES).package.root == snapshot.resolve()


def test_an_uncached_repository_names_what_was_looked_for(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve("acme/absent", tables=NO_TABLES)
    message = str(info.value)
    assert str(cache / "models--acme--absent" / "refs" / "main") in message
    assert "downloads are not allowed" in message and "`hf download acme/absent`" in message
    assert message.endswith("or start with --allow-download to fetch it as the server starts")
    with pytest.raises(ConfigError, match="`hf download acme/absent --revision v2`"):
        resolve("acme/absent@v2", tables=NO_TABLES)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE is set: .*or unset HF_HUB_OFFLINE"):
        resolve("acme/absent", tables=NO_TABLES, allow_download=True)


def test_something_else_entirely_is_a_clear_error(cache: Path) -> None:
    tables = load_tables([TabledKeywords()])
    with pytest.raises(ConfigError, match=r"not a package directory.*built-in: example-keywords"):
        resolve("no-such-model", tables=tables)
    with pytest.raises(ConfigError, match="not a package directory"):
        resolve("./missing/dir", tables=tables)


def test_links_may_point_into_blobs_only(
    cache: Path, keywords_variants: dict[str, Path], tmp_path: Path
) -> None:
    snapshot = cache_package(cache, "acme/evil", REV_A, keywords_variants["default"])
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    link = snapshot / "example_model.json"
    link.unlink()
    link.symlink_to(outside)
    package = resolve("acme/evil", tables=NO_TABLES).package
    with pytest.raises(PackageError, match="leaves the model package"):
        package.read_bytes("example_model.json")
    with pytest.raises(PackageError, match="pickled checkpoint"):
        package.path("pytorch_model.bin")


def test_a_builtin_name_resolves_its_pinned_revision(cache: Path, keywords_variants: dict[str, Path]) -> None:
    tables = load_tables([TabledKeywords()])
    cache_package(cache, "vllm-sr-example/keywords", REV_A, keywords_variants["short"])  # refs/main
    pinned = cache_package(
        cache, "vllm-sr-example/keywords", PINNED, keywords_variants["default"], main=False
    )
    resolved = resolve("example-keywords", tables=tables)
    assert resolved.builtin is tables.models["example-keywords"]
    assert resolved.package.root == pinned.resolve() and resolved.package.name == "example-keywords"
    # The repository at the pinned revision is the built-in model too; at another it is not.
    assert resolve(f"vllm-sr-example/keywords@{PINNED}", tables=tables).builtin is not None
    assert resolve("vllm-sr-example/keywords", tables=tables).builtin is None


def test_a_builtin_with_a_tampered_file_is_refused(cache: Path, keywords_variants: dict[str, Path]) -> None:
    tables = load_tables([TabledKeywords()])
    snapshot = cache_package(cache, "vllm-sr-example/keywords", PINNED, keywords_variants["short"])
    with pytest.raises(PackageError, match=r"'example-keywords': file 'example_model\.json' has SHA-256"):
        resolve("example-keywords", tables=tables)
    (snapshot / "example_model.json").unlink()
    with pytest.raises(PackageError, match="is missing"):
        resolve("example-keywords", tables=tables)
    (snapshot.parent / PINNED).rename(snapshot.parent / REV_A)
    with pytest.raises(ConfigError, match=f"models--vllm-sr-example--keywords/snapshots/{PINNED}"):
        resolve("example-keywords", tables=tables)


def test_conflicting_tables_refuse_every_reference(keywords_variants: dict[str, Path]) -> None:
    tables = Tables(conflict="built-in model tables conflict: a and b")
    with pytest.raises(ConfigError, match="a and b"):
        resolve(str(keywords_variants["default"]), tables=tables)


def test_download_only_when_allowed(
    cache: Path, keywords_variants: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The download path, with huggingface_hub's snapshot_download faked (no Hub here)."""
    import huggingface_hub

    calls: list[tuple[str, str | None]] = []

    def fake_download(repo_id: str, *, revision: str | None, cache_dir: Path, **_: object) -> str:
        calls.append((repo_id, revision))
        return str(cache_package(Path(cache_dir), repo_id, REV_A, keywords_variants["default"]))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    with pytest.raises(ConfigError, match="downloads are not allowed"):
        resolve("acme/fresh", tables=NO_TABLES)
    resolved = resolve("acme/fresh", tables=NO_TABLES, allow_download=True)
    assert calls == [("acme/fresh", None)] and resolved.revision == REV_A
    assert KeywordFamily().detect(resolved.package)
