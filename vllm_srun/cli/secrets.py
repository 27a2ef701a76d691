"""`vllm-srun init-secrets DIR` and `vllm-srun api-key`: the deployment's secrets as files.

init-secrets (compose's one-shot `secret-init`) writes, each mode 0600 and owned by its one
reader: `api-keys` (the app's `--api-key-file`), `redis-password` (added to app and worker
Redis URLs) and `redis-server-password` (the same, for the Redis servers). It writes what is
missing, keeps what is there and replaces what the environment sets. Other processes read the
files through `*_FILE` variables, so no secret is on a command line that `ps` shows.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.errors import ConfigError

API_KEY_ENV = "VLLM_SRUN_API_KEY"
API_KEY_FILE_ENV = "VLLM_SRUN_API_KEY_FILE"
REDIS_PASSWORD_ENV = "VLLM_SRUN_REDIS_PASSWORD"
REDIS_PASSWORD_FILE_ENV = "VLLM_SRUN_REDIS_PASSWORD_FILE"

API_KEYS = "api-keys"
REDIS_PASSWORD = "redis-password"
REDIS_SERVER_PASSWORD = "redis-server-password"
# 256 bits from the operating system's generator, written as hex: safe in a URL, a Redis
# configuration line and an Authorization header alike.
SECRET_BYTES = 32
FILE_MODE = 0o600
# What a value given in the environment may hold: it is written into a Redis configuration line
# and an HTTP header, where whitespace, quotes and backslashes would change its meaning.
REFUSED_CHARACTERS = frozenset(" \t\r\n\"'\\")


@dataclass(frozen=True, kw_only=True)
class Owner:
    """A numeric user and group, as `UID:GID`."""

    uid: int
    gid: int

    @classmethod
    def parse(cls, text: str) -> Owner:
        uid, sep, gid = text.partition(":")
        if not sep or not uid.isdigit() or not gid.isdigit():
            raise ValueError(f"{text!r} is not UID:GID (two numbers, e.g. 10001:10001)")
        return cls(uid=int(uid), gid=int(gid))


def generated() -> str:
    return secrets.token_hex(SECRET_BYTES)


def given(env: Mapping[str, str], name: str) -> str | None:
    """The value `name` sets in `env`, or None where it is unset or empty (generate one)."""
    value = env.get(name, "")
    if not value:
        return None
    bad = sorted({repr(ch) for ch in value if ch in REFUSED_CHARACTERS or not ch.isprintable()})
    if bad:
        raise ConfigError(f"{name}: may not contain {', '.join(bad)} (use letters, digits and punctuation)")
    if value.startswith("#"):  # the key file's reader takes such a line for a comment
        raise ConfigError(f"{name}: may not start with '#' (a key file's comment lines start with it)")
    return value


def write_secret(path: Path, value: str, owner: Owner | None) -> None:
    """Replace `path` with `value`, mode 0600, owned by `owner`: written under a temporary name
    and renamed, so a start that is interrupted never leaves half a secret. The mode is set
    before the owner, because a process without CAP_FOWNER may not change it after."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)  # left by a start that was killed while writing
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.write(fd, value.encode() + b"\n")
        os.fsync(fd)
        os.fchmod(fd, FILE_MODE)
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
    except BaseException:
        os.close(fd)
        temporary.unlink()
        raise
    os.close(fd)
    os.replace(temporary, path)


def init_secrets(
    directory: Path, *, env: Mapping[str, str], owner: Owner | None = None, redis_owner: Owner | None = None
) -> dict[str, str]:
    """Write what is missing in `directory`, keep what is there, and replace what `env` sets
    (VLLM_SRUN_REDIS_PASSWORD, VLLM_SRUN_API_KEY: an operator's vllm-srun.env wins). Returns each
    file's name and what was done with it: "generated", "kept" or "from VARIABLE"."""
    if not directory.is_dir():
        raise ConfigError(f"init-secrets: {directory} is not a directory (mount the secrets volume there)")
    # Both values are checked before anything is written: a refused one leaves the files as they were.
    key, password = given(env, API_KEY_ENV), given(env, REDIS_PASSWORD_ENV)
    done: dict[str, str] = {}
    if key is not None or not (directory / API_KEYS).exists():
        write_secret(directory / API_KEYS, key or generated(), owner)
        done[API_KEYS] = f"from {API_KEY_ENV}" if key else "generated"
    else:
        done[API_KEYS] = "kept"
    pair = (REDIS_PASSWORD, REDIS_SERVER_PASSWORD)
    # The two copies are one secret: both are written together, or both kept.
    if password is None and all((directory / name).exists() for name in pair):
        done.update(dict.fromkeys(pair, "kept"))
        return done
    value = password or generated()
    write_secret(directory / REDIS_PASSWORD, value, owner)
    write_secret(directory / REDIS_SERVER_PASSWORD, value, redis_owner)
    done.update(dict.fromkeys(pair, f"from {REDIS_PASSWORD_ENV}" if password else "generated"))
    return done


def read_secret_file(variable: str, env: Mapping[str, str]) -> str:
    """The one value in the file that `variable` names (its trailing newline dropped)."""
    path = env[variable]
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{variable}={path}: {exc}") from exc
    if not value:
        raise ConfigError(f"{variable}={path}: the file is empty")
    return value


def redis_password(env: Mapping[str, str]) -> str | None:
    """VLLM_SRUN_REDIS_PASSWORD, or the file VLLM_SRUN_REDIS_PASSWORD_FILE names; None for neither."""
    if env.get(REDIS_PASSWORD_ENV) and env.get(REDIS_PASSWORD_FILE_ENV):
        raise ConfigError(f"{REDIS_PASSWORD_ENV} and {REDIS_PASSWORD_FILE_ENV} are both set: set one")
    if env.get(REDIS_PASSWORD_FILE_ENV):
        return read_secret_file(REDIS_PASSWORD_FILE_ENV, env)
    return env.get(REDIS_PASSWORD_ENV) or None


def api_key(env: Mapping[str, str]) -> str:
    """The key a client sends: the first in VLLM_SRUN_API_KEY_FILE's file, else VLLM_SRUN_API_KEY."""
    from vllm_srun.app.tenants import read_key_file

    if env.get(API_KEY_FILE_ENV):
        return read_key_file(Path(env[API_KEY_FILE_ENV]))[0]
    if env.get(API_KEY_ENV):
        return env[API_KEY_ENV]
    raise ConfigError(f"no API key here: neither {API_KEY_FILE_ENV} nor {API_KEY_ENV} is set")


def add_parsers(sub: Any) -> None:
    init = sub.add_parser(
        "init-secrets",
        help="write the Redis password and API key files a deployment reads, once (compose's secret-init)",
    )
    init.add_argument("directory", type=Path, help="where the files go (the secrets volume)")
    init.add_argument("--owner", type=_owner, default=None, help="UID:GID of app and workers' files")
    init.add_argument("--redis-owner", type=_owner, default=None, help="UID:GID of Redis's password file")
    sub.add_parser(
        "api-key", help=f"print the API key clients send (from ${API_KEY_FILE_ENV} or ${API_KEY_ENV})"
    )


def _owner(text: str) -> Owner:
    try:
        return Owner.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_init_secrets(args: argparse.Namespace) -> int:
    done = init_secrets(args.directory, env=os.environ, owner=args.owner, redis_owner=args.redis_owner)
    for name, action in done.items():
        print(f"{args.directory / name}: {action}")
    return 0


def cmd_api_key(args: argparse.Namespace) -> int:
    print(api_key(os.environ))
    return 0
