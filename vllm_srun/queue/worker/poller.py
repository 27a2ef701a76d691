"""`WakeablePoller`: drives one arq worker, polling as soon as its wake channel says work is queued.

It polls at the latest every `poll_delay_s` as the fallback, hands cancel messages to
`on_cancel`, and outlives a lost Redis: it reconnects and subscribes again, with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from vllm_srun.queue.links import Listening
from vllm_srun.queue.redis import REDIS_ERRORS, pubsub_client
from vllm_srun.queue.worker.arq_worker import DrivenWorker

log = structlog.get_logger("vllm_srun.worker")

# A poller that lost Redis reconnects after this, doubling up to its fallback poll interval.
RECONNECT_S = 0.1


class WakeablePoller:
    """Drives one arq worker: polls when its wake channel says a job is queued, and at the latest
    every `poll_delay_s` as the fallback; hands cancel messages to `on_cancel`."""

    def __init__(
        self,
        worker: DrivenWorker,
        *,
        wake_channel: str,
        pubsub_url: str,
        cancel_channel: str | None = None,
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        self.worker = worker
        self.wake_channel = wake_channel
        self.pubsub_url = pubsub_url
        self.cancel_channel = cancel_channel
        self.on_cancel = on_cancel
        self._stopping = False

    def stop(self) -> None:
        """End `run` at its next turn. A cancellation alone is not enough: redis-py's
        `get_message` can swallow one that lands while it reads, and the loop would go on."""
        self._stopping = True

    def _handle(self, message: dict[str, Any]) -> None:
        """A cancel message names a request to drop; anything else was a wake-up."""
        if self.on_cancel is None or self.cancel_channel is None or message.get("type") != "message":
            return
        if message.get("channel") == self.cancel_channel.encode():
            self.on_cancel(message["data"].decode())

    async def run(self) -> None:
        worker = self.worker
        subscriber = pubsub_client(self.pubsub_url)
        pubsub = subscriber.pubsub()
        listening = Listening(pubsub, subscriber.timeouts)
        subscribed = False
        channels = [self.wake_channel] + ([self.cancel_channel] if self.cancel_channel else [])
        # Redis lost (restarted, a failover): reconnect and subscribe again, with backoff up to
        # the fallback poll's interval; one warning per outage.
        delay_s = RECONNECT_S
        try:
            while not self._stopping:
                try:
                    if not subscribed:
                        await pubsub.subscribe(*channels)
                        listening = Listening(pubsub, subscriber.timeouts)
                        subscribed = True
                    await worker.poll()
                    if delay_s > RECONNECT_S:
                        log.info("poll_recovered", queue=worker.queue_name)
                    delay_s = RECONNECT_S
                    # A silent subscription (a link gone quiet without a FIN) raises here within
                    # RedisTimeouts.silence_s: the poller subscribes again on a new connection.
                    message = await listening.next(worker.poll_delay_s)
                    while message is not None:  # one poll answers every wake-up queued so far
                        self._handle(message)
                        message = await listening.next(0)
                except Exception as exc:  # the poller must outlive any one failure
                    # A lost Redis, or one that refuses (out of memory under noeviction, a
                    # replica gone read-only): a poller that ended here would stop this worker
                    # taking work from the queue for good.
                    if delay_s == RECONNECT_S:
                        log.warning("poll_failed", queue=worker.queue_name, error=repr(exc))
                    subscribed = False
                    with contextlib.suppress(*REDIS_ERRORS):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
                    pubsub = subscriber.pubsub()  # on a cluster, on the next node
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, max(worker.poll_delay_s, RECONNECT_S))
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await subscriber.aclose()
