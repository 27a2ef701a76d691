"""`vllm-srun jobs`: submit, wait, status, results, cancel, against a real server."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Server, free_port, write_keywords

from vllm_srun.cli.jobs import ProgressBar, add_jobs_parser, cmd_jobs

pytestmark = pytest.mark.timeout(60)

TEXTS = ["refund my charge", "the parcel delivery", "good morning"]
LABELS = ["billing", "shipping", "other"]


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_keywords(tmp_path_factory.mktemp("pkg") / "kw")
    return module_server(str(package), "--served-model-name", "kw")


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"input": TEXTS[i % 3], "custom_id": f"c{i}"}) for i in range(25)]
    path.write_text("\n".join(lines) + "\n")
    return path


def jobs(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_jobs_parser(parser.add_subparsers(dest="command"))
    return cmd_jobs(parser.parse_args(["jobs", *argv]))


def submit(path: Path, url: str, *extra: str) -> int:
    return jobs("submit", str(path), "--model", "kw", "--surface", "classify", "--url", url, *extra)


def read_jsonl(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_submit_wait_output_writes_every_result_in_order(
    server: Server, jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    assert submit(jsonl, server.url) == 0
    assert capsys.readouterr().out.strip().startswith("job_")
    code = submit(jsonl, server.url, "--wait", "--output", str(out))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.strip().startswith("job_")  # the id; results went to --output
    assert "25/25" in captured.err  # the progress line off a terminal
    results = read_jsonl(out.read_text())
    assert [r["custom_id"] for r in results] == [f"c{i}" for i in range(25)]
    assert [r["response"]["results"][0]["label"] for r in results] == [LABELS[i % 3] for i in range(25)]  # type: ignore[index]


def test_submit_wait_to_stdout_keeps_stdout_pure_jsonl(
    server: Server, jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit(jsonl, server.url, "--wait") == 0
    captured = capsys.readouterr()
    assert [r["index"] for r in read_jsonl(captured.out)] == list(range(25))
    assert "job_" in captured.err


def test_status_results_cancel(server: Server, jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--url", server.url]
    assert submit(jsonl, server.url, "--wait", "--output", "/dev/null") == 0
    job_id = capsys.readouterr().out.strip()
    assert jobs("status", job_id, *url) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["id"] == job_id and status["status"] == "completed" and status["counts"]["done"] == 25
    assert jobs("results", job_id, *url) == 0
    assert [r["custom_id"] for r in read_jsonl(capsys.readouterr().out)] == [f"c{i}" for i in range(25)]
    assert jobs("cancel", job_id, *url) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"  # over already: unchanged


def test_on_error_record_and_reject(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "refund"}\n\nnot json\n')
    assert submit(bad, server.url) == 2
    assert "error: line 3: not JSON" in capsys.readouterr().err  # the file's own line number
    assert submit(bad, server.url, "--on-error", "record", "--wait") == 0
    results = read_jsonl(capsys.readouterr().out)
    assert results[1]["error"]["code"] == "invalid_request"  # type: ignore[index]


def test_idempotency_key_and_env_url(
    server: Server, jsonl: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_SRUN_URL", server.url)
    args = ["submit", str(jsonl), "--model", "kw", "--surface", "classify", "--idempotency-key", "cli-1"]
    assert jobs(*args) == 0 and jobs(*args) == 0
    first, second = capsys.readouterr().out.split()
    assert first == second


def test_errors_exit_2_with_a_message(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert jobs("status", "job_nope", "--url", server.url) == 2
    assert capsys.readouterr().err.startswith("error: job 'job_nope' does not exist")
    assert jobs("status", "x", "--url", "not a url") == 2
    assert capsys.readouterr().err.startswith("error: cannot reach the server at not a url")


def test_unreachable_server_exits_2_from_main(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    main = "import sys; from vllm_srun.cli.jobs import main; sys.exit(main())"
    command = [sys.executable, "-c", main, "jobs", "status", "job_x", "--url", url]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: cannot reach the server at {url}:"), proc.stderr


def test_submit_of_a_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert jobs("submit", str(tmp_path / "none.jsonl"), "--model", "m", "--surface", "classify") == 2
    assert "none.jsonl" in capsys.readouterr().err


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    stream = FakeTerminal()
    bar = ProgressBar(stream, width=10)
    bar.update({"total": 4, "done": 1, "failed": 0, "cached": 0})
    bar.update({"total": 4, "done": 3, "failed": 1, "cached": 2})  # held back: within 0.1 s
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r[##--------] 1/4") and "\r[##########] 4/4 100%  failed 1  cached 2\n" in text
    plain = io.StringIO()
    bar = ProgressBar(plain, width=4)
    bar.update({"total": 2, "done": 2, "failed": 0, "cached": 0})
    bar.close()
    assert plain.getvalue() == "[####] 2/2 100%\n"


def test_a_failed_results_call_leaves_the_output_file_alone(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "keep.jsonl"
    keep.write_text('{"kept": true}\n')
    assert jobs("results", "job_nope", "--url", server.url, "--output", str(keep)) == 2
    assert jobs("results", "job_x", "--url", f"http://127.0.0.1:{free_port()}", "--output", str(keep)) == 2
    assert keep.read_text() == '{"kept": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["keep.jsonl"]  # no partial file left
    capsys.readouterr()


def test_submit_checks_its_arguments_before_submitting(
    server: Server, jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = tmp_path / "nodir" / "out.jsonl"
    assert submit(jsonl, server.url, "--wait", "--output", str(nowhere)) == 2
    assert "does not exist" in capsys.readouterr().err
    assert submit(jsonl, server.url, "--output", str(tmp_path / "out.jsonl")) == 2  # no --wait
    assert "--wait" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert submit(empty, server.url) == 2
    assert "has no requests" in capsys.readouterr().err
    # None of them reached the server: a job would have printed its id on stdout.
    assert capsys.readouterr().out == ""


def test_results_of_an_unfinished_job_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers import RedisProcess

    redis = RedisProcess(tmp_path / "redis.log")
    # A replica with no worker: the job stays queued.
    replica = Server([str(write_keywords(tmp_path / "kw")), "--redis", redis.url], tmp_path / "replica.log")
    try:
        replica.wait_ready()
        body = tmp_path / "in.jsonl"
        body.write_text('{"input": "refund"}\n')
        assert jobs("submit", str(body), "--model", "kw", "--surface", "classify", "--url", replica.url) == 0
        job_id = capsys.readouterr().out.strip()
        assert jobs("results", job_id, "--url", replica.url) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and f"warning: job {job_id} is queued: 0 of 1 results" in captured.err
    finally:
        replica.stop()
        redis.stop()
