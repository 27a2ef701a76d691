"""The proxy's app replicas: every address each upstream URL's host resolves to, and its health.

Names are resolved again at every health round, so a compose service scaled to N replicas needs
no restart; a target keeps its health across rounds by URL.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import structlog

log = structlog.get_logger("vllm_srun.cli.proxy")


@dataclass
class Target:
    """One replica address, and whether its last health check (or connection) succeeded."""

    url: str
    host_header: str
    healthy: bool = True


@dataclass
class Upstreams:
    """The targets of the given upstream URLs, kept current by `check` rounds."""

    urls: list[str]
    health_path: str = "/health/live"
    targets: list[Target] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self, skip: set[str]) -> Target | None:
        """The next healthy target round-robin, not one in `skip` (tried for this request)."""
        live = [t for t in self.targets if t.healthy and t.url not in skip]
        if not live:
            return None
        return live[next(self._turn) % len(live)]

    async def resolve(self) -> None:
        """Targets for every address each upstream's host resolves to; health kept by URL."""
        known = {t.url: t for t in self.targets}
        fresh: list[Target] = []
        loop = asyncio.get_running_loop()
        for url in self.urls:
            parts = urlsplit(url)
            host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("upstream_unresolved", upstream=url, error=str(exc))
                continue
            for address in dict.fromkeys(str(info[4][0]) for info in infos):
                shown = f"[{address}]" if ":" in address else address
                target_url = f"{parts.scheme}://{shown}:{port}"
                fresh.append(known.get(target_url) or Target(target_url, parts.netloc))
        self.targets = fresh

    async def check(self, client: httpx.AsyncClient) -> None:
        """One health round: resolve again, then ask every target."""
        await self.resolve()

        async def one(target: Target) -> None:
            try:
                reply = await client.get(target.url + self.health_path, timeout=2.0)
                healthy = reply.status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy != target.healthy:
                log.info("upstream_health", upstream=target.url, healthy=healthy)
            target.healthy = healthy

        await asyncio.gather(*(one(t) for t in self.targets))
