"""In-process queue fixtures: a real Redis server (the embedded one), the example keyword model
on its real counting engine, and a stat logger that counts the rows forwarded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from arq.connections import ArqRedis
from helpers import write_keywords

from vllm_srun.cli.embedded_redis import EmbeddedRedis
from vllm_srun.plugins.base import LoadedModel, WorkItem
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.plugins.stats import StatLoggerBase, Stats
from vllm_srun.plugins.surfaces import ClassifyRequest
from vllm_srun.queue.planning import plan_with_keys
from vllm_srun.queue.redis import make_pool
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker
from vllm_srun.registry.loader import ModelOptions, load_model


class _Rows(StatLoggerBase):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        self.sizes.append(size)


@pytest.fixture
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[ArqRedis]:
    pool = make_pool(redis_url)
    yield pool
    await pool.aclose()


@pytest.fixture(scope="session")
def keywords_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    package = write_keywords(tmp_path_factory.mktemp("queue") / "kw")
    loaded, _ = load_model(
        load_plugins(), ModelOptions(ref=str(package), engine="example_counts"), with_engine=True
    )
    return loaded


@pytest.fixture
def batches() -> list[int]:
    """The size of each forward `stats` records: identical work collapsed shows as fewer rows."""
    return []


@pytest.fixture
def stats(batches: list[int]) -> Stats:
    return Stats([_Rows(batches)])


@pytest.fixture
def deployment(keywords_model: LoadedModel) -> Iterator[Deployment]:
    executor = ThreadPoolExecutor(max_workers=1)
    yield Deployment(model=keywords_model, limits=BatchLimits(batch_wait_ms=0), executor=executor)
    executor.shutdown(wait=False)


@pytest.fixture
async def worker(redis_url: str, deployment: Deployment, stats: Stats) -> AsyncIterator[DeviceWorker]:
    """A device worker serving `deployment`. Its fallback poll is long: a job that starts at
    once was woken by push."""
    worker = DeviceWorker(redis_url=redis_url, deployments=[deployment], stats=stats, poll_delay_s=5.0)
    await worker.start()
    yield worker
    await worker.close()


@pytest.fixture
def classify_items(keywords_model: LoadedModel) -> Callable[..., list[WorkItem]]:
    """The keyword model's work items (with cache keys) for classifying the given texts."""

    def plan(*texts: str) -> list[WorkItem]:
        return plan_with_keys(keywords_model, "classify", ClassifyRequest(input=list(texts))).items

    return plan
