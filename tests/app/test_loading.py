"""Bringing models up: loading, warming and the twin check run on the device's forward thread,
the one thread of the process that runs torch's parallel regions (GNU OpenMP does not spin
once it manages more threads than there are cores: docs/performance.md, Tuning)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllm_srun.accelerators.cpu_features import host_refusal
from vllm_srun.app import loading
from vllm_srun.app.loading import Serving
from vllm_srun.app.settings import ModelSettings, ServerSettings
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.loader import ModelOptions

STEPS = ("load_prepared", "run_golden", "check_approximation")


def spy_on_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(step, thread name) for each step of bringing a model up, in order."""
    seen: list[tuple[str, str]] = []
    for name in STEPS:
        real = getattr(loading, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kwargs: object) -> object:
            seen.append((_name, threading.current_thread().name))
            return _real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(loading, name, spy)
    return seen


def brought_up(ref: str, *, with_device: bool) -> tuple[Serving, str | None]:
    """A Serving of one bfloat16 model brought up (no device worker: nothing connects), and
    the name of its device's forward thread where it has one."""
    options = ModelOptions(ref=ref, device="cpu", dtype="bfloat16")
    settings = ServerSettings(
        models=(ModelSettings(options=options),), redis_url="redis://127.0.0.1:1", embedded=True
    )
    serving = Serving.prepare(load_plugins(), settings, with_device=with_device)
    try:
        asyncio.run(serving._bring_up_all())
        if not with_device:
            return serving, None
        forward = serving.executors.for_device("cpu").submit(lambda: threading.current_thread().name)
        return serving, forward.result()
    finally:
        serving.executors.shutdown()


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch")
    if host_refusal("bfloat16"):
        pytest.skip("bfloat16 is refused on this CPU")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    return str(write_fixture(tmp_path_factory.mktemp("loading") / "embed", variant="bert-embedding"))


def test_each_step_runs_on_the_devices_forward_thread(embedder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy_on_steps(monkeypatch)
    serving, thread = brought_up(embedder, with_device=True)
    states = [(m.state, m.reason) for m in serving.models.values()]
    assert [state for state, _ in states] == ["ready"], states
    assert thread is not None and thread.startswith("forward-cpu")
    assert seen == [(step, thread) for step in STEPS]


def test_a_process_without_a_device_starts_no_forward_thread(
    embedder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app replica (or `serve --device-process`'s app) brings models up without engines."""
    seen = spy_on_steps(monkeypatch)
    serving, _ = brought_up(embedder, with_device=False)
    assert [m.state for m in serving.models.values()] == ["ready"]
    assert seen and not any(name.startswith("forward-") for _, name in seen)
