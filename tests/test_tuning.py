"""Forward threads give way to the event loop: a lower priority for them alone."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from vllm_srun.tuning import FORWARD_NICE_ENV, lower_forward_priority

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
