"""`Replies`: an app process's reply channel, and whether its link to the main Redis is up.

Workers publish each job's reply on the channel of the process that queued it; a future per job
waits for it here. The subscription is made again whenever it is lost or silent (see
`redis.Listening`); `link_down` says why while it is.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from vllm_srun.queue import keys, protocol
from vllm_srun.queue.links import Listening
from vllm_srun.queue.redis import REDIS_ERRORS, describe_url, pubsub_client

log = structlog.get_logger("vllm_srun.queue")

# The reply subscription, once lost, is tried again after this, doubling up to the maximum.
RESUBSCRIBE_S = 0.1
RESUBSCRIBE_MAX_S = 2.0


class Replies:
    """The reply subscription of one app process (`app_id`) on the Redis at `redis_url`."""

    def __init__(self, redis_url: str, app_id: str) -> None:
        self.redis_url = redis_url
        self.channel = keys.reply_channel(app_id)
        # Per job id: the future its reply completes (the first reply wins).
        self.waiting: dict[str, asyncio.Future[protocol.JobReply]] = {}
        self._subscriber = pubsub_client(redis_url)
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._closing = False
        # Why the link is down now (None: up), for requests refused and /health.
        self.link_down: str | None = None

    async def start(self, wait_s: float = 5.0) -> None:
        """Subscribe, waiting at most `wait_s` for Redis to confirm it."""
        self._listener = asyncio.get_running_loop().create_task(self._listen(), name="reply-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), wait_s)

    async def close(self) -> None:
        self._closing = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        with contextlib.suppress(*REDIS_ERRORS):
            await self._subscriber.aclose()

    async def _listen(self) -> None:
        # The loops check `_closing` as well as being cancelled: redis-py can swallow a
        # cancellation that lands while it reads, and the listener would never end.
        # Lost (Redis restarted, a failover, a silent link): subscribe again, sooner than a
        # fixed poll would and without hammering a Redis that is still down; one warning per
        # outage. The link counts as up again once Redis confirms the subscription.
        delay_s = RESUBSCRIBE_S
        while not self._closing:
            pubsub = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                listening = Listening(pubsub, self._subscriber.timeouts)
                while not self._closing:
                    message = await listening.next(1.0)
                    if message is None:
                        continue
                    if message.get("type") == "subscribe":
                        self._link_up()
                        delay_s = RESUBSCRIBE_S
                    elif message.get("type") == "message":
                        self._on_reply(message["data"])
            except Exception as exc:  # an ended listener leaves requests to the fallback
                self._subscribed.clear()
                if self.link_down is None:
                    log.warning("reply_channel_lost", error=repr(exc))
                    self.link_down = f"the link to Redis at {describe_url(self.redis_url)} is down ({exc})"
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RESUBSCRIBE_MAX_S)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _link_up(self) -> None:
        if self.link_down is not None:
            log.info("reply_channel_back")
        self.link_down = None
        self._subscribed.set()

    def _on_reply(self, raw: bytes) -> None:
        try:
            reply = protocol.decode_reply(raw)
        except Exception:
            log.warning("bad_reply")
            return
        future = self.waiting.pop(reply.request_id, None)
        if future is not None and not future.done():
            future.set_result(reply)
