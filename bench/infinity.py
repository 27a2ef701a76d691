"""Infinity (`infinity-emb`, torch engine) as a second peer: the same model served over HTTP.

Infinity runs from its own virtual environment, never this one: it pins sentence-transformers
below 4 and numpy below 2, which the project's own extras do not. `--infinity-venv PATH` names
a venv that has the `infinity_emb` CLI; `--infinity-create` makes one under
`bench/.venv-infinity` (or reuses it): `python -m venv`, then torch first from the pinned CPU
wheel (a bare `pip install torch` resolves to a multi-GB CUDA build), then
`infinity-emb[server,torch]` at INFINITY_VERSION — `server` brings the FastAPI app and the
`v2` CLI, `torch` brings sentence-transformers, the loader of its torch engine — with click
below 8.2: its pinned typer (0.12) fails on click 8.2's flag checks before the CLI parses
anything ("Secondary flag is not valid for non-boolean flag").

The server is started as `infinity_emb v2 --model-id MODEL_DIR --engine torch --device cpu
--no-bettertransformer --batch-size B --port P` with the hub offline: `--model-id` takes the local model directory, so
nothing is downloaded. `--no-bettertransformer`: BetterTransformer needs
`optimum`, which the `torch` extra does not bring, and without it this version fails at start-up
(NameError on BetterTransformerManager) instead of falling back. Its OpenAI-shaped route is `/embeddings` (no URL prefix by default).
Its torch intra-op threads are set through OMP_NUM_THREADS to the count the vllm-srun server
and the ceiling use, and it inherits this process's OMP_WAIT_POLICY.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.procs import HOST, HTTPProc, free_port

INFINITY_VERSION = "0.0.77"
PINS = ("click<8.2",)
TORCH_VERSION = "2.13.0"
DEFAULT_VENV = Path(__file__).resolve().parent / ".venv-infinity"
BATCH_SIZE = 32  # Infinity's own default, and the sentence-transformers peer's batch
EMBEDDINGS_PATH = "/embeddings"
ENABLE_HINT = (
    "run with --infinity-create (makes bench/.venv-infinity: torch CPU + infinity-emb"
    f"[server,torch]=={INFINITY_VERSION}) or --infinity-venv PATH"
)
# The server shapes that also run against Infinity.
SHAPES = ("c1x1", "c32x1", "c4x64")


def cli(venv: Path) -> Path:
    return venv / "bin" / "infinity_emb"


def create_venv(venv: Path = DEFAULT_VENV) -> Path:
    """A venv with the `infinity_emb` CLI at `venv` (created when it has none); its path."""
    if cli(venv).is_file():
        return venv
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"torch=={TORCH_VERSION}"], check=True)
    subprocess.run([*pip, f"infinity-emb[server,torch]=={INFINITY_VERSION}", *PINS], check=True)
    return venv


def version(venv: Path) -> str | None:
    """The installed infinity-emb version in `venv` (None when it cannot be read)."""
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('infinity-emb'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (done.stdout.strip() or None) if done.returncode == 0 else None


class InfinityServer(HTTPProc):
    """`infinity_emb v2` serving `model` on a free port of 127.0.0.1, torch engine, hub offline."""

    def __init__(
        self,
        venv: Path,
        model: str,
        *,
        threads: int,
        batch_size: int = BATCH_SIZE,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        args = [
            str(cli(venv)),
            "v2",
            "--model-id",
            model,
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--no-bettertransformer",
        ]
        args += ["--batch-size", str(batch_size), "--host", HOST, "--port", str(self.port), *extra]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
        }
        super().__init__([*args, "--log-level", "warning"], "infinity", env=env)
