"""vllm_srun.cli.secrets: what init-secrets writes and keeps, and how the CLI reads the files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from vllm_srun.cli.secrets import (
    API_KEYS,
    REDIS_PASSWORD,
    REDIS_SERVER_PASSWORD,
    Owner,
    api_key,
    init_secrets,
    redis_password,
)
from vllm_srun.errors import ConfigError


def test_a_half_written_pair_is_made_again_as_one(tmp_path: Path) -> None:
    init_secrets(tmp_path, env={})
    (tmp_path / REDIS_SERVER_PASSWORD).unlink()
    key = (tmp_path / API_KEYS).read_text()
    done = init_secrets(tmp_path, env={})
    assert done == {API_KEYS: "kept", REDIS_PASSWORD: "generated", REDIS_SERVER_PASSWORD: "generated"}
    assert (tmp_path / REDIS_PASSWORD).read_text() == (tmp_path / REDIS_SERVER_PASSWORD).read_text()
    assert (tmp_path / API_KEYS).read_text() == key


def test_a_temporary_file_left_by_a_killed_start_is_replaced(tmp_path: Path) -> None:
    (tmp_path / f".{API_KEYS}.tmp").write_text("half")
    init_secrets(tmp_path, env={})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [API_KEYS, REDIS_PASSWORD, REDIS_SERVER_PASSWORD]
    )
    assert stat.S_IMODE((tmp_path / API_KEYS).stat().st_mode) == 0o600


def test_owner_is_uid_and_gid() -> None:
    assert Owner.parse("999:1000") == Owner(uid=999, gid=1000)
    for bad in ("999", "redis:redis", "1:-2", ""):
        with pytest.raises(ValueError, match="UID:GID"):
            Owner.parse(bad)


def test_the_cli_reads_the_password_file_or_the_variable(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file\n")
    assert redis_password({"VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "pw")}) == "from-file"
    assert redis_password({"VLLM_SRUN_REDIS_PASSWORD": "from-env"}) == "from-env"
    assert redis_password({}) is None
    both = {"VLLM_SRUN_REDIS_PASSWORD": "a", "VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "pw")}
    with pytest.raises(ConfigError, match="both set"):
        redis_password(both)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"VLLM_SRUN_REDIS_PASSWORD_FILE=.*empty"):
        redis_password({"VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "empty")})


def test_api_key_prints_the_files_first_key(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("# callers\nfirst\nsecond\n")
    assert api_key({"VLLM_SRUN_API_KEY_FILE": str(tmp_path / "keys")}) == "first"
    assert api_key({"VLLM_SRUN_API_KEY": "k"}) == "k"
    with pytest.raises(ConfigError, match="VLLM_SRUN_API_KEY_FILE nor VLLM_SRUN_API_KEY"):
        api_key({})


@pytest.mark.parametrize(
    ("value", "why"),
    [("has space", "may not contain ' '"), ("#hash-first", "may not start with '#'"), ('quo"te', "may not contain")],
)
def test_a_chosen_key_the_files_cannot_hold_is_refused_naming_its_variable(
    tmp_path: Path, value: str, why: str
) -> None:
    """A key the key file would not read back as written (a space, a quote, a leading '#', which
    its reader takes for a comment) is refused before anything is written."""
    with pytest.raises(ConfigError, match=f"VLLM_SRUN_API_KEY: {why}"):
        init_secrets(tmp_path, env={"VLLM_SRUN_API_KEY": value})
    assert not list(tmp_path.iterdir())
