"""Redis links: how long a client waits on one (`RedisTimeouts`), and a subscription that
tells a silent link from a quiet channel (`Listening`).

Every client of this package takes its options from `RedisTimeouts.from_env()`;
docs/network.md states what each timeout bounds.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio.client import PubSub
from redis.exceptions import TimeoutError as RedisTimeoutError

CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class RedisTimeouts:
    """How long any client of this package waits on a Redis link before it calls the link lost.

    `connect_s` bounds opening a connection; `socket_s` one command's reply; `health_check_s`
    is how long a pooled connection may sit idle before its next use PINGs it first;
    `silence_s` is how long a subscription may hear nothing (not even the PONG of the PING it
    sends every third of that) before it is dropped and made again; TCP keepalive probes
    after `keepalive_idle_s` of quiet, so the kernel drops a peer that vanished without a FIN.
    Read from VLLM_SRUN_REDIS_{CONNECT,SOCKET,HEALTH_CHECK,SILENCE,KEEPALIVE_IDLE}_S.
    """

    connect_s: float = CONNECT_TIMEOUT_S
    socket_s: float = SOCKET_TIMEOUT_S
    health_check_s: float = 10.0
    silence_s: float = 6.0
    keepalive_idle_s: float = 10.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RedisTimeouts:
        """The defaults, each overridden by its environment variable; a value that is not a
        positive number is a ConfigError naming the variable."""
        from vllm_srun.errors import ConfigError

        environ = os.environ if environ is None else environ
        given: dict[str, float] = {}
        for name in ("connect_s", "socket_s", "health_check_s", "silence_s", "keepalive_idle_s"):
            variable = f"VLLM_SRUN_REDIS_{name.upper()}"
            raw = environ.get(variable)
            if raw is None or raw == "":
                continue
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")
            if not value > 0 or value == float("inf"):
                raise ConfigError(f"{variable}={raw!r}: must be a positive number of seconds")
            given[name] = value
        return cls(**given)

    @property
    def ping_every_s(self) -> float:
        """How often a quiet subscription PINGs, so that silence means a dead link."""
        return self.silence_s / 3

    def options(self, url: str) -> dict[str, Any]:
        """redis-py's connection options for a client on `url` (keepalive on TCP only)."""
        options: dict[str, Any] = {
            "socket_connect_timeout": self.connect_s,
            "socket_timeout": self.socket_s,
            "health_check_interval": self.health_check_s,
        }
        if not url.startswith("unix://"):
            options["socket_keepalive"] = True
            options["socket_keepalive_options"] = _keepalive(self.keepalive_idle_s)
        return options


def _keepalive(idle_s: float) -> dict[int, int]:
    """Probe after `idle_s` of quiet, then every third of it, three times: a vanished peer is
    dropped by the kernel within twice `idle_s` (where the platform names these options)."""
    wanted = {"TCP_KEEPIDLE": idle_s, "TCP_KEEPINTVL": idle_s / 3, "TCP_KEEPCNT": 3}
    return {getattr(socket, n): max(1, int(v)) for n, v in wanted.items() if hasattr(socket, n)}


class SilentLink(RedisTimeoutError):
    """A subscription heard nothing from Redis for `RedisTimeouts.silence_s`."""


class Listening:
    """Reads one subscription and tells a silent link from a quiet channel: it PINGs when
    nothing came for `ping_every_s`, and raises SilentLink once nothing at all (no message, no
    PONG, no subscribe confirmation) came for `silence_s`. A link that went silent without a
    FIN is thus dropped within `silence_s` plus one read's timeout."""

    def __init__(self, pubsub: PubSub, timeouts: RedisTimeouts) -> None:
        self.pubsub = pubsub
        self.timeouts = timeouts
        self.heard_at = self.pinged_at = time.monotonic()

    async def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message (subscribe confirmations included; PONGs are not returned), or None
        after `timeout_s`; SilentLink as soon as the link has been silent too long."""
        end = time.monotonic() + timeout_s
        silence_s, ping_every_s = self.timeouts.silence_s, self.timeouts.ping_every_s
        while True:
            now = time.monotonic()
            if now - self.heard_at >= silence_s:
                raise SilentLink(f"the subscription heard nothing from Redis for {now - self.heard_at:.1f} s")
            if now - max(self.heard_at, self.pinged_at) >= ping_every_s:
                self.pinged_at = now
                await self.pubsub.ping()
            ping_due = max(self.heard_at, self.pinged_at) + ping_every_s
            wait_s = max(0.0, min(end, self.heard_at + silence_s, ping_due) - now)
            message = await self.pubsub.get_message(timeout=wait_s)
            if message is not None:
                self.heard_at = time.monotonic()
                if message.get("type") != "pong":
                    return cast(dict[str, Any], message)
            if time.monotonic() >= end:
                return None
