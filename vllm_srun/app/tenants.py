"""Callers: who an API key is, and what of the server is theirs alone.

With API keys each key is a caller: a job belongs to the caller that made it (another gets
404), an Idempotency-Key is scoped to its caller, and with several keys each caller's cache keys
carry a salt of its own, so no caller learns from a cache hit what another sent (`--shared-cache`
shares them on purpose). Only digests of the keys are kept (`keys.caller_id`, `keys.cache_salt`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from vllm_srun.errors import ConfigError
from vllm_srun.queue import keys


@dataclass(frozen=True)
class Caller:
    """One API key's identity: `id` names its jobs, `cache_salt` its cache keys ("" when
    shared)."""

    id: str
    cache_salt: str = ""


# The caller of the request being served, set by the API-key guard for every guarded route (None
# where the server takes no key). Surface routes reach the cache through `serving`, which reads
# it here rather than from each controller.
CALLER: ContextVar[Caller | None] = ContextVar("vllm_srun_caller", default=None)


def current_salt() -> str:
    caller = CALLER.get()
    return caller.cache_salt if caller is not None else ""


class Callers:
    """The keys a server takes, as digests; `identify` turns a presented key into its Caller."""

    def __init__(self, api_keys: Iterable[str], *, shared_cache: bool = False) -> None:
        unique = sorted(set(api_keys))
        salted = len(unique) > 1 and not shared_cache
        # By a digest of the presented key: a dict lookup on it leaks nothing of the keys'
        # bytes through timing, as a byte-wise compare would.
        self._by_digest = {
            _digest(key): Caller(keys.caller_id(key), keys.cache_salt(key) if salted else "")
            for key in unique
        }

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def __len__(self) -> int:
        return len(self._by_digest)

    def identify(self, token: str) -> Caller | None:
        return self._by_digest.get(_digest(token)) if token else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_key_file(path: Path) -> list[str]:
    """The keys in `path`: one per line; blank lines and lines starting with # are skipped. A
    file that names none is an error (a server with an empty key file would take no key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--api-key-file {path}: {exc}") from exc
    found = [line.strip() for line in text.splitlines()]
    found = [line for line in found if line and not line.startswith("#")]
    if not found:
        raise ConfigError(f"--api-key-file {path}: no key in it (one key per line)")
    if any(any(ch.isspace() for ch in key) for key in found):
        raise ConfigError(f"--api-key-file {path}: a key may not contain spaces")
    return found
