"""bfloat16 and int8 on the cpu only where its instruction sets run them: the detection as a
function of the flag set (any host can test every CPU), the refusal at start naming the dtype,
the device and what is missing, and /v1/models listing only what runs here.

A CPU without the flags is this host's CPU with `VLLM_SRUN_CPU_FLAGS` standing in for
/proc/cpuinfo: the same detection, fed the flag set of an older CPU.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO, Server

from vllm_srun.accelerators.cpu_features import (
    FLAGS_ENV,
    host_flags,
    native_dtypes,
    parse_flags,
    refusal,
)
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.loader import ModelOptions, prepare
from vllm_srun.registry.tables import load_tables

# Abridged /proc/cpuinfo of two cores of an x86 CPU with AVX2 only (a Zen 3, a Skylake client),
# and one core of a Neoverse V1 (Graviton 3), as Linux writes them.
X86_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""
NEOVERSE_V1 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs \
paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
"""


def test_flags_are_read_from_x86_and_arm_cpuinfo() -> None:
    assert {"avx2", "fma", "sse"} <= parse_flags(X86_AVX2)
    assert {"bf16", "i8mm", "sve"} <= parse_flags(NEOVERSE_V1)
    assert "0x41" not in parse_flags(NEOVERSE_V1)  # other lines are not flags


def test_x86_without_the_instructions_is_refused_naming_them() -> None:
    flags = parse_flags(X86_AVX2)
    bf16 = refusal("bfloat16", flags, "x86_64")
    assert bf16 is not None
    for named in ("AVX512-BF16", "AMX-BF16", "avx512_bf16", "amx_bf16", "slower than float32"):
        assert named in bf16, (named, bf16)
    int8 = refusal("int8", flags, "x86_64")
    assert int8 is not None and "AVX512-VNNI" in int8 and "AMX-INT8" in int8 and "avx_vnni" in int8
    assert native_dtypes(flags, "x86_64") == ["float32"]
    assert refusal("float32", flags, "x86_64") is None


@pytest.mark.parametrize(
    ("flag", "dtype"),
    [
        ("avx512_bf16", "bfloat16"),
        ("amx_bf16", "bfloat16"),
        ("avx512_vnni", "int8"),
        ("avx_vnni", "int8"),
        ("amx_int8", "int8"),
    ],
)
def test_any_one_x86_instruction_set_is_enough(flag: str, dtype: str) -> None:
    flags = parse_flags(X86_AVX2) | {flag}
    assert refusal(dtype, flags, "x86_64") is None
    assert native_dtypes(flags, "x86_64") == ["float32", dtype]


def test_arm_bf16_and_i8mm() -> None:
    assert native_dtypes(parse_flags(NEOVERSE_V1), "aarch64") == ["float32", "bfloat16", "int8"]
    older = parse_flags(NEOVERSE_V1) - {"bf16", "i8mm"}  # a Neoverse N1: neither
    bf16, int8 = refusal("bfloat16", older, "aarch64"), refusal("int8", older, "aarch64")
    assert bf16 is not None and "BF16" in bf16 and int8 is not None and "I8MM" in int8
    # Arm's flags are not x86's: avx512_bf16 on an Arm machine proves nothing.
    assert refusal("bfloat16", frozenset({"avx512_bf16"}), "aarch64") is not None


def test_an_unreadable_cpu_or_another_architecture_is_not_taken_on_trust() -> None:
    unread = refusal("bfloat16", None, "x86_64")
    assert unread is not None and FLAGS_ENV in unread and "cannot be confirmed" in unread
    other = refusal("int8", frozenset({"i8mm"}), "riscv64")
    assert other is not None and "riscv64" in other


def test_this_host_is_read_from_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FLAGS_ENV, raising=False)
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo on this host")
    flags = host_flags()
    assert flags == parse_flags(cpuinfo.read_text()) and flags
    monkeypatch.setenv(FLAGS_ENV, "sse avx2")
    assert host_flags() == {"sse", "avx2"}


def prepared_dtypes(ref: str, dtype: str) -> tuple[str, tuple[str, ...]]:
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    placement = prepare(
        plugins, tables, ModelOptions(ref=ref, dtype=dtype, device="cpu"), with_engine=True
    ).placement
    return placement.dtype, placement.dtypes


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    return str(write_fixture(tmp_path_factory.mktemp("cpu-features") / "embed", variant="bert-embedding"))


def test_the_loader_refuses_and_accepts_by_the_flags(embedder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the flag sets here are x86's")
    monkeypatch.setenv(FLAGS_ENV, "sse avx2")
    with pytest.raises(
        ConfigError, match=r"--dtype bfloat16 on cpu refused: this CPU lacks any of AVX512-BF16, AMX-BF16"
    ):
        prepared_dtypes(embedder, "bfloat16")
    with pytest.raises(
        ConfigError,
        match=r"--dtype int8 on cpu refused: this CPU lacks any of AVX512-VNNI, AVX-VNNI, AMX-INT8",
    ):
        prepared_dtypes(embedder, "int8")
    assert prepared_dtypes(embedder, "float32") == ("float32", ("float32",))
    monkeypatch.setenv(FLAGS_ENV, "sse avx2 amx_bf16")
    assert prepared_dtypes(embedder, "bfloat16") == ("bfloat16", ("float32", "bfloat16"))


def test_serve_is_refused_at_start_naming_the_dtype_the_device_and_the_instructions(embedder: str) -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the flag sets here are x86's")
    env = {**os.environ, FLAGS_ENV: "fpu sse sse2 avx avx2"}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_srun.cli", "serve", embedder, "--dtype", "bfloat16", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert result.returncode != 0, result.stdout
    for named in ("--dtype bfloat16 on cpu", "AVX512-BF16", "avx512_bf16", "slower than float32"):
        assert named in result.stderr, (named, result.stderr[-2000:])


def test_models_lists_only_the_dtypes_this_cpu_runs(
    embedder: str, module_server: Callable[..., Server]
) -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the flag sets here are x86's")
    server = module_server(embedder, env={FLAGS_ENV: "sse avx2 avx512_vnni"})
    (card,) = server.get("/v1/models").json()["data"]
    assert card["dtype"] == "float32" and card["dtypes"] == ["float32", "int8"]
