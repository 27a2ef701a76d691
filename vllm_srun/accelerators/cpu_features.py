"""Which reduced precisions this CPU multiplies natively, from the instruction sets it reports.

Where a CPU lacks the instructions, torch emulates bfloat16/int8 more slowly than float32, so
the dtype is refused. Flags come from /proc/cpuinfo (`flags` on x86, `Features` on Arm);
`VLLM_SRUN_CPU_FLAGS` (space-separated) stands in for them. `refusal(dtype, flags, machine)`
is a pure function of the flag set.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
FLAGS_ENV = "VLLM_SRUN_CPU_FLAGS"


@dataclass(frozen=True)
class Need:
    """The instruction sets of which any one runs `dtype` natively, as the CPU vendor names
    them (`sets`) and as /proc/cpuinfo spells their flags (`flags`, in the same order)."""

    dtype: str
    sets: tuple[str, ...]
    flags: tuple[str, ...]


# Per architecture family: bfloat16 dot products (AVX512-BF16 on Zen 4+ and Cooper Lake,
# AMX-BF16 on Sapphire Rapids+; Armv8.6 BF16 on Neoverse V1/V2) and int8 dot products with
# int32 accumulation (AVX512-VNNI, AVX-VNNI, AMX-INT8; Arm I8MM).
NEEDS = {
    "x86": (
        Need("bfloat16", ("AVX512-BF16", "AMX-BF16"), ("avx512_bf16", "amx_bf16")),
        Need("int8", ("AVX512-VNNI", "AVX-VNNI", "AMX-INT8"), ("avx512_vnni", "avx_vnni", "amx_int8")),
    ),
    "arm": (
        Need("bfloat16", ("BF16",), ("bf16",)),
        Need("int8", ("I8MM",), ("i8mm",)),
    ),
}
_FAMILIES = {"x86_64": "x86", "amd64": "x86", "i686": "x86", "aarch64": "arm", "arm64": "arm"}


def family_of(machine: str) -> str | None:
    """`x86` or `arm` for `platform.machine()`'s answer; None for another architecture."""
    return _FAMILIES.get(machine.lower())


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of /proc/cpuinfo's text: every `flags` or `Features` line (one per core)."""
    found: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            found.update(value.split())
    return frozenset(found)


def host_flags() -> frozenset[str] | None:
    """This CPU's flags (`VLLM_SRUN_CPU_FLAGS` where set); None where neither is readable."""
    given = os.environ.get(FLAGS_ENV)
    if given is not None:
        return frozenset(given.split())
    return _cpuinfo_flags()


@functools.cache
def _cpuinfo_flags() -> frozenset[str] | None:
    """/proc/cpuinfo's flags, read once a process: a CPU's instruction sets do not change."""
    try:
        return parse_flags(CPUINFO.read_text(errors="replace"))
    except OSError:
        return None


def refusal(dtype: str, flags: frozenset[str] | None, machine: str) -> str | None:
    """None when a CPU of `machine` with `flags` runs `dtype` natively (float32 always), else
    why not: the instruction sets missing, and why emulation is no way out."""
    if dtype in ("float32", "auto"):
        return None
    family = family_of(machine)
    need = next((n for n in NEEDS.get(family or "", ()) if n.dtype == dtype), None)
    if need is None:
        return f"{dtype} has no native instructions this runtime knows on a {machine} CPU"
    if flags is None:
        return (
            f"the CPU's instruction sets cannot be read ({CPUINFO} is missing; set {FLAGS_ENV}), "
            f"so {dtype} ({' or '.join(need.sets)}) cannot be confirmed"
        )
    if flags.intersection(need.flags):
        return None
    sets = need.sets[0] if len(need.sets) == 1 else f"any of {', '.join(need.sets)}"
    return (
        f"this CPU lacks {sets} (no {' or '.join(need.flags)} among its flags), the instructions "
        f"that run {dtype} natively; emulated, {dtype} would run slower than float32"
    )


def host_refusal(dtype: str) -> str | None:
    """`refusal` for this host's CPU."""
    return refusal(dtype, host_flags(), platform.machine())


def native_dtypes(flags: frozenset[str] | None, machine: str) -> list[str]:
    """The dtypes a CPU of `machine` with `flags` runs natively, float32 first."""
    return [d for d in ("float32", "bfloat16", "int8") if refusal(d, flags, machine) is None]
