"""The models a process serves and, where it runs forwards, its device worker.

Start-up first *prepares* every model (package, family, device, engine: small files only), so
a wrong setting refuses the start at once; then each model goes loading -> warming -> ready,
or failed with a reason, in the background, and one failed model never stops the others.
`Serving` is that start, for `serve` (embedded or as a replica) and for `worker` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog

from vllm_srun.app.embedding_types import Calibration
from vllm_srun.app.settings import ModelSettings, ServerSettings
from vllm_srun.errors import ConfigError, PackageError, SrunError, model_failure
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.discovery import Plugins
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker
from vllm_srun.registry.approximate import Refused, check_approximation
from vllm_srun.registry.golden import device_class_of, run_golden
from vllm_srun.registry.loader import ModelOptions, Placement, Prepared, fall_back, load_prepared, prepare
from vllm_srun.registry.names import own_name
from vllm_srun.registry.tables import load_tables
from vllm_srun.tuning import set_forward_threads, start_forward_thread

log = structlog.get_logger("vllm_srun.app")


@dataclass
class ServedModel:
    """A model's place in the server: its state, and once loaded, the model itself."""

    name: str
    limits: BatchLimits
    aliases: tuple[str, ...] = ()
    state: str = "loading"
    reason: str | None = None
    golden: str | None = None
    # What the golden check compared: recorded answers run (`golden_checked`) and matched, and
    # its own account of the reference it held the model to.
    golden_checked: int | None = None
    golden_matched: int | None = None
    golden_reference: str | None = None
    model: LoadedModel | None = None
    placement: Placement | None = None
    approximation: dict[str, Any] | None = None
    # The calibration vectors its int8 and uint8 embeddings are quantized on (app/quantization.py).
    calibration: Calibration = field(default_factory=Calibration)
    # When this process took the model on (Unix seconds): OpenAI's `created` of a model.
    created: int = field(default_factory=lambda: int(time.time()))
    # What resolving it found: its family, and the Hub repository and revision it came from
    # (None for a local directory, or a model that could not be prepared).
    family: str | None = None
    repository: str | None = None
    revision: str | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "golden": self.golden}
        if self.approximation is not None:
            out["approximation"] = self.approximation
        if self.reason:
            out["reason"] = self.reason
        if self.placement is not None:
            out.update(engine=self.placement.engine, device=self.placement.device, dtype=self.placement.dtype)
        return out


def name_of(options: ModelOptions) -> str:
    """The name of a model that could not be resolved: the one it was given, else what its
    reference would have been named (a directory's model's own name or folder name, a
    repository's id)."""
    if options.name:
        return options.name
    path = Path(options.ref).expanduser()
    if not path.is_dir():
        return options.ref.partition("@")[0] or options.ref
    try:
        return own_name(ModelPackage(path)) or path.name
    except PackageError:
        return path.name


def unclaimed_aliases(prepared: list[Prepared], claimed: Sequence[str]) -> list[Prepared]:
    """`prepared`, each keeping the default aliases (a folder's name) that no other model
    claims: two packages in folders of one name leave it to neither, instead of refusing."""
    counts: dict[str, int] = {}
    for p in prepared:
        for alias in p.default_aliases:
            counts[alias] = counts.get(alias, 0) + 1
    taken = set(claimed) | {p.name for p in prepared} | {a for p in prepared for a in p.options.aliases}
    return [
        replace(p, default_aliases=tuple(a for a in p.default_aliases if counts[a] == 1 and a not in taken))
        for p in prepared
    ]


def check_names(models: Sequence[tuple[str, tuple[str, ...]]]) -> None:
    """Refuse the start when a name or alias is given twice: a request naming it could reach
    either model."""
    owner: dict[str, str] = {}
    for name, aliases in models:
        labels = (name, *aliases)
        twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
        if twice is not None:
            raise ConfigError(f"model {name!r} is given the name {twice!r} twice")
        for label in labels:
            first = owner.get(label)
            if first is None:
                continue
            if first == label == name:
                raise ConfigError(f"two models are named {name!r}: give each a name (--served-model-name)")
            raise ConfigError(
                f"{label!r} would name both {first!r} and {name!r}: a name or alias may name one model"
            )
        owner.update(dict.fromkeys(labels, name))


def prepare_all(
    plugins: Plugins, settings: Sequence[ModelSettings], *, with_engine: bool
) -> tuple[list[tuple[Prepared, ModelSettings]], list[tuple[str, ModelSettings, str]]]:
    """(prepared models, (name, settings, reason) of those that could not be prepared).

    When none can be prepared the start is refused with the reasons: a typo in the only model
    is a start-up error, not a server that never becomes ready.
    """
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    prepared, failed = [], []
    for model_settings in settings:
        try:
            prepared.append(
                (prepare(plugins, tables, model_settings.options, with_engine=with_engine), model_settings)
            )
        except SrunError as exc:
            log.error("model_refused", model=name_of(model_settings.options), reason=exc.message)
            failed.append((name_of(model_settings.options), model_settings, exc.message))
        except BaseException as exc:  # a broken package must not stop the other models
            if not model_failure(exc):
                raise
            reason = f"{type(exc).__name__}: {exc}"
            log.exception("model_refused", model=name_of(model_settings.options), reason=reason)
            failed.append((name_of(model_settings.options), model_settings, reason))
    if not prepared:
        raise ConfigError("; ".join(reason for _, _, reason in failed) or "no model to serve")
    claimed = [label for name, s, _ in failed for label in (name, *s.options.aliases)]
    kept = unclaimed_aliases([p for p, _ in prepared], claimed)
    prepared = list(zip(kept, (s for _, s in prepared), strict=True))
    check_names(
        [(p.name, p.aliases) for p, _ in prepared] + [(name, s.options.aliases) for name, s, _ in failed]
    )
    return prepared, failed


def _dtype_of(prepared: Prepared) -> dict[str, str]:
    return {"dtype": prepared.placement.dtype, "dtype_reason": prepared.placement.reason}


T = TypeVar("T")
# The executor a device's torch work runs on (Executors.for_device); None: the loop's default.
ExecutorFor = Callable[[str], Executor]


async def _on(executor: Executor | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn` on `executor` (None: the loop's default) in a copy of this context, as
    asyncio.to_thread runs it, so its log lines keep what the caller bound."""
    call = partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


async def _load_checked(served: ServedModel, prepared: Prepared, executor_for: ExecutorFor | None) -> str:
    """Load, warm on the golden check, and hold approximate numerics to their twin check
    (Refused where they miss a bound), each step logged as it starts and with its duration as
    it ends, on the device's forward thread where `executor_for` gives it. The golden check's
    status."""
    step = partial(_step, served.name, prepared.placement.dtype)
    executor = executor_for(prepared.placement.device) if executor_for else None
    async with step("loading"):
        served.model = await _on(executor, load_prepared, prepared)
    served.state = "warming"
    device_class = device_class_of(prepared.placement.device)
    records = prepared.resolved.builtin.golden if prepared.resolved.builtin else None
    async with step("warming: golden answers" if records else "warming: determinism check"):
        result = await _on(executor, run_golden, served.model, records, device_class=device_class)
    served.golden, served.golden_reference = result.status, result.reason
    if result.status == "verified":  # every record ran and matched
        served.golden_checked = served.golden_matched = len((records or {}).get(device_class, ()))
    if result.status == "failed":
        raise ConfigError(f"golden check failed: {result.reason}")
    if served.model.info.numerics != "float32" and served.model.engine_model is not None:
        async with step("warming: comparing with a float32 twin"):
            check = await _on(executor, check_approximation, prepared, served.model)
        served.approximation = check.describe()
    return result.status


async def bring_up(
    served: ServedModel,
    prepared: Prepared,
    on_ready: Callable[[ServedModel], Awaitable[None]],
    executor_for: ExecutorFor | None = None,
) -> None:
    """loading -> warming -> ready (then `on_ready`), or failed with the reason. A --max-speed
    model whose twin check refuses its dtype goes on to the next it may fall back to. With
    `executor_for`, every step runs on the device's forward thread, which then is the only
    thread of the process that runs torch's parallel regions (docs/performance.md, Tuning)."""
    started = time.perf_counter()
    try:
        while True:
            try:
                golden = await _load_checked(served, prepared, executor_for)
                break
            except Refused as exc:
                following = fall_back(prepared, exc.short)
                if following is None:
                    raise
                log.warning(
                    "max_speed_fallback", model=served.name, refused=exc.short, **_dtype_of(following)
                )
                served.model, served.state = None, "loading"
                prepared, served.placement = following, following.placement
        await on_ready(served)
        served.state = "ready"
        loosened = (served.approximation or {}).get("loosened")
        log.info(
            "model_ready",
            model=served.name,
            golden=golden,
            **_dtype_of(prepared),
            **({"loosened_bounds": loosened} if loosened else {}),
            s=round(time.perf_counter() - started, 3),
        )
    except SrunError as exc:
        served.state, served.reason = "failed", exc.message
        log.error("model_failed", model=served.name, reason=exc.message)
    except BaseException as exc:  # a model's own failure to load is its state, not the server's
        if not model_failure(exc):
            raise
        served.state, served.reason = "failed", f"{type(exc).__name__}: {exc}"
        log.exception("model_failed", model=served.name)


@contextlib.asynccontextmanager
async def _step(model: str, dtype: str, step: str) -> AsyncIterator[None]:
    """Log `step` of bringing `model` up as it starts and, with its seconds, as it ends (a
    warm-up of several seconds is otherwise a silent /health 503)."""
    log.info("model_step", model=model, dtype=dtype, step=step)
    started = time.perf_counter()
    yield
    log.info(
        "model_step_done", model=model, dtype=dtype, step=step, s=round(time.perf_counter() - started, 3)
    )


class Executors:
    """One single-thread executor per device: one forward at a time on each device."""

    def __init__(self, intra_op_threads: int | None = None) -> None:
        self.intra_op_threads = intra_op_threads
        set_forward_threads(intra_op_threads)  # engines size pools of their own at load from it
        self._by_device: dict[str, ThreadPoolExecutor] = {}

    def for_device(self, device: str) -> ThreadPoolExecutor:
        """The device's executor: its forwards, and the loading and warming of its models."""
        if device not in self._by_device:
            self._by_device[device] = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"forward-{device}",
                initializer=partial(start_forward_thread, self.intra_op_threads),
            )
        return self._by_device[device]

    def deployment(self, served: ServedModel) -> Deployment:
        assert served.model is not None and served.placement is not None
        executor = self.for_device(served.placement.device)
        return Deployment(model=served.model, limits=served.limits, executor=executor)

    def shutdown(self) -> None:
        for executor in self._by_device.values():
            executor.shutdown(wait=False, cancel_futures=True)


def make_worker(settings: ServerSettings, stats: Stats) -> DeviceWorker:
    """A device worker on the settings' Redis, serving nothing until deployments are added."""
    return DeviceWorker(
        redis_url=settings.redis_url,
        deployments=[],
        stats=stats,
        job_timeout_s=settings.job_timeout_s,
        job_ttl_s=settings.job_ttl_s,
        result_ttl_s=settings.cache_ttl_s,
        cache_url=settings.cache_redis_url,
    )


@dataclass
class Serving:
    """A process's models and, where it runs forwards (`with_device`), its device worker.

    The one start path of `serve` (embedded: the app and a device worker; as a replica: the
    models without engines) and of `worker` (a device worker alone). `prepare` reads only small
    files, so a wrong setting refuses the start before anything connects; `start` starts the
    device worker and brings the models up, one after another, in the background; `loaded`
    waits for that.
    """

    settings: ServerSettings
    with_device: bool
    models: dict[str, ServedModel]
    prepared: list[Prepared]
    worker: DeviceWorker | None = None
    executors: Executors = field(init=False)
    _loading: asyncio.Task[None] | None = None
    config_error: str | None = None

    def __post_init__(self) -> None:
        self.executors = Executors(self.settings.intra_op_threads)

    @classmethod
    def prepare(cls, plugins: Plugins, settings: ServerSettings, *, with_device: bool) -> Serving:
        prepared, failed = prepare_all(plugins, settings.models, with_engine=with_device)
        models = {
            name: ServedModel(
                name, model_settings.limits, model_settings.options.aliases, state="failed", reason=reason
            )
            for name, model_settings, reason in failed
        }
        for p, model_settings in prepared:
            models[p.name] = ServedModel(
                p.name,
                model_settings.limits,
                p.aliases,
                placement=p.placement,
                family=p.family.name,
                repository=p.resolved.repository,
                revision=p.resolved.revision,
            )
        return cls(
            settings=settings, with_device=with_device, models=models, prepared=[p for p, _ in prepared]
        )

    async def start(self, stats: Stats) -> None:
        if self.with_device:
            self.worker = make_worker(self.settings, stats)
            await self.worker.start()
        self._loading = asyncio.get_running_loop().create_task(self._bring_up_all())

    async def loaded(self) -> None:
        """Every model ready or failed."""
        if self._loading is not None:
            await asyncio.shield(self._loading)

    def find(self, name: str) -> ServedModel | None:
        """The model `name` names: its id or one of its aliases (unique: checked at start)."""
        found = self.models.get(name)
        if found is None:
            found = next((m for m in self.models.values() if name in m.aliases), None)
        return found

    def ready(self) -> list[str]:
        return [name for name, served in self.models.items() if served.state == "ready"]

    async def _bring_up_all(self) -> None:
        # One at a time: models loading side by side would only split the same cores.
        serve = self._serve if self.worker else _nothing
        executor_for = self.executors.for_device if self.with_device else None
        for p in self.prepared:
            await bring_up(self.models[p.name], p, partial(self._checked, serve), executor_for)
            if self.config_error is not None:
                return

    async def _checked(self, serve: Callable[[ServedModel], Awaitable[None]], served: ServedModel) -> None:
        check = self.settings.model_checks.get(served.name)
        if check is not None and served.model is not None:
            try:
                check(served.model)
            except ConfigError as exc:
                self.config_error = exc.message
                if self.settings.on_config_error is not None:
                    self.settings.on_config_error(exc.message)
                raise
        await serve(served)

    async def _serve(self, served: ServedModel) -> None:
        assert self.worker is not None
        await self.worker.add(self.executors.deployment(served))

    async def close(self) -> None:
        if self._loading is not None:
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        if self.worker is not None:
            await bounded("device worker", self.worker.close(), 2.0)
        self.executors.shutdown()


async def _nothing(_: ServedModel) -> None:
    return None


async def bounded(step: str, closing: Awaitable[None], timeout_s: float) -> None:
    """Run one step of a stop for at most `timeout_s`; one that overruns is left behind with a
    warning naming it (the process is ending), never waited for. A stop must fit the 10 s that
    a supervisor (docker stop, Kubernetes, systemd) grants before SIGKILL, whatever state Redis
    or a forward is in."""
    task = asyncio.ensure_future(closing)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        log.warning("stop_step_overran", step=step, timeout_s=timeout_s)
        return
    if not task.cancelled() and task.exception() is not None:
        log.warning("stop_step_failed", step=step, error=repr(task.exception()))
