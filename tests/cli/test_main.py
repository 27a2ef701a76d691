"""The command line on careless input and on stop signals: one `error:` line, no traceback,
nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers import REPO, RedisProcess, Server, start_worker

from vllm_srun.cli.fixture import FIXTURE_MARKER
from vllm_srun.cli.main import main


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error `argv` ends with; exit status 2 either way argparse or we refuse."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "99999"),
        ("--port", "-1"),
        ("--max-num-seqs", "0"),
        ("--max-num-batched-tokens", "-3"),
        ("--batch-wait-ms", "-1"),
        ("--request-timeout-s", "0"),
        ("--max-inputs", "0"),
        ("--local-cache-mb", "-1"),
        ("--log-level", "bogus"),
        ("--max-queued-items", "many"),
    ],
)
def test_serve_refuses_nonsense_numbers(
    capsys: pytest.CaptureFixture[str], keywords: Path, flag: str, value: str
) -> None:
    line = refused(capsys, ["serve", str(keywords), flag, value])
    assert flag in line


def test_redis_urls_with_a_bad_scheme(capsys: pytest.CaptureFixture[str], keywords: Path) -> None:
    for command in ("serve", "worker"):
        line = refused(capsys, [command, str(keywords), "--redis", "nonsense://x"])
        assert line.startswith("error: --redis 'nonsense://x'") and "redis://" in line


def test_worker_metrics_port_taken(
    capsys: pytest.CaptureFixture[str], keywords: Path, redis_proc: RedisProcess
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(
            capsys, ["worker", str(keywords), "--redis", redis_proc.url, "--metrics-port", str(port)]
        )
    assert line.startswith(f"error: --metrics-port {port}:")


def test_fixture_never_writes_over_other_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert "exists and is not empty" in refused(
        capsys, ["fixture", str(mine), "--family", "example_keywords"]
    )
    assert (mine / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in refused(
        capsys, ["fixture", str(tmp_path / "file"), "--family", "example_keywords"]
    )
    assert "no family named 'nope'" in refused(capsys, ["fixture", str(tmp_path / "new"), "--family", "nope"])


def test_fixture_rewrites_its_own_output_whole(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    assert main(["fixture", str(out), "--family", "task_heads", "--variant", "bert-embedding"]) == 0
    assert (out / "modules.json").exists() and (out / FIXTURE_MARKER).exists()
    # Again, as a different variant: the embedding model's files do not linger.
    assert main(["fixture", str(out), "--family", "task_heads", "--variant", "bert-sequence"]) == 0
    assert not (out / "modules.json").exists()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    capsys.readouterr()


def test_bench_takes_its_own_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    for argv in (["bench", "--help"], ["bench", "--", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        assert "--quick" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--texts", "zero"])
    assert exc.value.code == 2 and "--texts" in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _redis_dir(pid: int) -> Path:
    # Redis rewrites its command line, but it works in the --dir it was given.
    for child in _children(pid):
        cwd = Path(os.readlink(f"/proc/{child}/cwd"))
        if cwd.name.startswith("vllm-srun-redis-"):
            return cwd
    raise AssertionError("serve has no redis-server child")


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_serve_stops_its_redis_on_a_signal(
    start_server: Callable[..., Server], keywords: Path, sig: int, status: int
) -> None:
    server = start_server(str(keywords))
    redis_dir = _redis_dir(server.proc.pid)
    assert redis_dir.is_dir()
    server.proc.send_signal(sig)
    assert server.proc.wait(timeout=15) == status, server.log()
    assert not redis_dir.exists(), "the embedded Redis's directory was left behind"
    assert "Traceback" not in server.log()


def test_an_open_event_stream_neither_starves_nor_blocks_a_stop(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess
) -> None:
    # A replica with no worker: the job stays queued, so its stream has nothing to send.
    server = start_server(str(keywords), "--redis", redis_proc.url)
    job = httpx.post(
        f"{server.url}/v1/jobs?surface=classify&model=keywords",
        content=b'{"input": "refund"}\n',
        headers={"content-type": "application/x-ndjson"},
    ).json()
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job['id']}/events", timeout=10) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line) == ": keep-alive"
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=20) == 0, server.log()
    assert time.monotonic() - started < 15


def test_a_worker_serves_a_replica_and_stops_on_sigterm(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess, tmp_path: Path
) -> None:
    # The worker starts through the same path as serve's embedded worker (Serving).
    worker = start_worker(tmp_path, keywords, redis_proc.url, "--intra-op-threads", "1")
    try:
        assert "worker ready: keywords" in worker.log()
        app = start_server(str(keywords), "--redis", redis_proc.url)
        answer = httpx.post(f"{app.url}/v1/classify", json={"input": "refund"}, timeout=30)
        assert answer.status_code == 200, answer.text
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(timeout=20) == 0, worker.log()
        assert "Traceback" not in worker.log()
    finally:
        worker.stop()


def _names(argv: list[str]) -> list[tuple[str | None, tuple[str, ...]]]:
    """The (name, aliases) of each model `serve argv` would serve."""
    from vllm_srun.cli.main import build_parser
    from vllm_srun.cli.startup import model_settings

    settings = model_settings(build_parser().parse_args(["serve", *argv]))
    return [(s.options.name, s.options.aliases) for s in settings]


def test_served_model_name_takes_an_id_then_aliases_as_vllm_does(keywords: Path, tmp_path: Path) -> None:
    assert _names([str(keywords)]) == [(None, ())]
    assert _names([str(keywords), "--served-model-name", "kw"]) == [("kw", ())]
    assert _names([str(keywords), "--served-model-name", "kw", "acme/kw", "k"]) == [("kw", ("acme/kw", "k"))]
    # Several models: the flag once per MODEL, in their order.
    other = str(keywords.parent / "other")
    argv = [str(keywords), other, "--served-model-name", "a", "x", "--served-model-name", "b"]
    assert _names(argv) == [("a", ("x",)), ("b", ())]


def test_served_model_names_that_do_not_fit_are_refused(
    capsys: pytest.CaptureFixture[str], keywords: Path
) -> None:
    two = [str(keywords), str(keywords.parent / "other")]
    line = refused(capsys, ["serve", *two, "--served-model-name", "a", "b"])
    assert line.startswith("error: --served-model-name: given 1 times for 2 MODEL(s)")
    line = refused(capsys, ["serve", str(keywords), "--served-model-name", "a", "--served-model-name", "b"])
    assert "given 2 times for 1 MODEL(s)" in line
    # A name or alias reaches one model only: refused before anything starts.
    line = refused(capsys, ["serve", *two, "--served-model-name", "a", "b", "--served-model-name", "b"])
    assert line == "error: 'b' would name both 'a' and 'b': a name or alias may name one model"
    line = refused(capsys, ["serve", str(keywords), "--served-model-name", "a", "a"])
    assert line == "error: model 'a' is given the name 'a' twice"


def test_devices_reports_each_accelerator_and_the_auto_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The router reads `auto` and refuses anything but a device name (accelerator[:N]).
    assert report["auto"] in report["devices"] and report["auto"] != "auto"
    assert report["accelerators"]["cpu"] == {"available": True, "auto_priority": 100, "devices": ["cpu"]}
    # The best available accelerator by auto_priority: a GPU when one is found, else the CPU.
    cuda = report["accelerators"]["cuda"]
    assert report["auto"] == (cuda["devices"][0] if cuda["devices"] else "cpu")
    assert set(report["devices"]) == {d for a in report["accelerators"].values() for d in a["devices"]}
