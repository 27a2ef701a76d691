"""The compose topology started as processes: redis, two app replicas, two device workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import RedisProcess, Server, Topology, free_port, start_worker, wait_healthy


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Callable[..., Topology]]:
    """Call with the package and extra worker / app options; everything stops after the test."""
    made: list[Topology] = []

    def make(package: Path, *, worker_args: tuple[str, ...] = (), app_args: tuple[str, ...] = ()) -> Topology:
        # The main Redis holds queues and job state: it must not evict (the cache may, apart).
        redis = RedisProcess(tmp_path / "redis.log")
        apps = [
            Server([str(package), "--redis", redis.url, *app_args], tmp_path / f"app-{i}.log")
            for i in range(2)
        ]
        ports = [free_port() for _ in range(2)]
        workers = [
            start_worker(tmp_path, package, redis.url, "--metrics-port", str(port), *worker_args)
            for port in ports
        ]
        topo = Topology(redis, apps, workers, [f"http://127.0.0.1:{p}/metrics" for p in ports])
        made.append(topo)
        for app in apps:
            app.wait_ready()
            wait_healthy(app)
        return topo

    yield make
    for topo in made:
        topo.stop()
