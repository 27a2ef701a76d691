"""Forward threads give way to the event loop: a lower priority for them alone; and they run
with the intra-op thread count the settings give, handed over as a setting."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import write_keywords

from vllm_srun import tuning
from vllm_srun.app.loading import Executors, ServedModel
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.registry.loader import ModelOptions, load_model
from vllm_srun.tuning import FORWARD_NICE_ENV, configure_cpu_threads, lower_forward_priority

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")


def nice_of_a_forward_thread() -> tuple[int, int]:
    """(nice of a thread started by the forward thread, nice of the forward thread)."""

    def child_and_own() -> tuple[int, int]:
        seen: list[int] = []
        child = threading.Thread(
            target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        )
        child.start()
        child.join()
        return seen[0], os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with ThreadPoolExecutor(max_workers=1, initializer=lower_forward_priority) as executor:
        return executor.submit(child_and_own).result()


def test_forward_threads_and_the_threads_they_start_run_lower(monkeypatch: pytest.MonkeyPatch) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    monkeypatch.setenv(FORWARD_NICE_ENV, "3")
    child, own = nice_of_a_forward_thread()
    assert own == min(19, base + 3) and child == own
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller is untouched


@pytest.mark.parametrize("value", ["0", "-5", "not-a-number"])
def test_zero_negative_or_malformed_settings_change_nothing(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    monkeypatch.setenv(FORWARD_NICE_ENV, value)
    assert nice_of_a_forward_thread() == (base, base)


def forward_threads(tmp_path: Path, intra_op_threads: int | None) -> int:
    """torch's thread count inside the forward executor the runtime makes for a cpu model."""
    torch = pytest.importorskip("torch")
    loaded, placement = load_model(
        load_plugins(),
        ModelOptions(ref=str(write_keywords(tmp_path / "kw")), engine="example_counts"),
        with_engine=True,
    )
    served = ServedModel("kw", BatchLimits(), model=loaded, placement=placement)
    executors = Executors(intra_op_threads)
    before = torch.get_num_threads()
    try:
        return int(executors.deployment(served).executor.submit(torch.get_num_threads).result())
    finally:
        executors.shutdown()
        torch.set_num_threads(before)  # the count is the process's: leave it as other tests found it


def test_forwards_run_with_the_intra_op_threads_setting(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    wanted = 2 if torch.get_num_threads() == 1 else 1
    assert forward_threads(tmp_path, wanted) == wanted


def test_without_the_setting_the_thread_count_is_left_alone(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    assert forward_threads(tmp_path, None) == torch.get_num_threads()


def test_configure_cpu_threads_gives_every_core_by_default_and_idle_threads_spin_briefly_then_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert configure_cpu_threads(None) == (os.cpu_count() or 1)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert os.environ["GOMP_SPINCOUNT"] == str(tuning.OMP_SPIN_COUNT)
    # A spin count of the environment's own stands.
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    configure_cpu_threads(None)
    assert (os.environ["OMP_WAIT_POLICY"], os.environ["GOMP_SPINCOUNT"]) == ("PASSIVE", "0")
    # So does a wait policy, and no spin count then overrides what it means.
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    assert configure_cpu_threads(3) == 3 and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    assert "GOMP_SPINCOUNT" not in os.environ


def test_freed_memory_goes_back_at_most_once_per_interval() -> None:
    import ctypes.util

    from vllm_srun import tuning

    if ctypes.util.find_library("c") is None:
        pytest.skip("no libc to trim")
    assert tuning.return_freed_memory(0.0)  # no interval: it runs
    assert not tuning.return_freed_memory(3600.0)  # it just ran
    assert tuning.return_freed_memory(0.0)
