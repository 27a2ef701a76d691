"""`vllm-srun jobs`: submit bulk jobs to a running server, follow them, fetch their results.

This module imports nothing heavy at import time (the client and httpx load when a command
runs; the surface descriptors are msgspec Structs), so registering the parser costs
`vllm-srun serve` nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from vllm_srun.cli.parsing import Parser, reads
from vllm_srun.plugins.surfaces import REGISTRY

URL_ENV = "VLLM_SRUN_URL"
API_KEY_ENV = "VLLM_SRUN_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"


class ProgressBar:
    """Job progress on a stream: a bar redrawn in place on a terminal, else a line now and then.

    Off a terminal (a log file, CI) carriage returns would pile up into one unreadable line,
    so there it writes a plain line every `interval_s` seconds and a last one at the end.
    """

    def __init__(self, stream: TextIO, *, width: int = 30, interval_s: float = 10.0) -> None:
        self.stream = stream
        self.width = width
        self.interval_s = interval_s
        self.tty = stream.isatty()
        self._last_s = 0.0
        self._last_text = ""
        self._pending = ""

    def render(self, counts: dict[str, int]) -> str:
        total, finished = counts["total"], counts["done"] + counts["failed"]
        fraction = finished / total if total else 1.0
        filled = int(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        text = f"[{bar}] {finished}/{total} {fraction:4.0%}"
        if counts.get("failed"):
            text += f"  failed {counts['failed']}"
        if counts.get("cached"):
            text += f"  cached {counts['cached']}"
        return text

    def update(self, counts: dict[str, int]) -> None:
        text = self.render(counts)
        now = time.monotonic()
        # Redraws are throttled too: a fast job sends thousands of result events a second.
        interval = 0.1 if self.tty else self.interval_s
        if text == self._last_text or now - self._last_s < interval:
            self._pending = text
            return
        self._draw(text, now)

    def _draw(self, text: str, now: float) -> None:
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()
        self._last_s, self._last_text, self._pending = now, text, ""

    def close(self) -> None:
        """Draw the latest counts if they were held back, and end the line."""
        if self._pending and self._pending != self._last_text:
            self._draw(self._pending, time.monotonic())
        if self.tty and self._last_text:
            self.stream.write("\n")
            self.stream.flush()


def add_jobs_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `jobs` and its subcommands on an argparse subparsers object."""
    common = Parser(add_help=False)
    reads(
        common.add_argument(
            "--url", default=os.environ.get(URL_ENV, DEFAULT_URL), help=f"server URL [default: {DEFAULT_URL}]"
        ),
        URL_ENV,
    )
    reads(
        common.add_argument(
            "--api-key", default=os.environ.get(API_KEY_ENV), help="API key sent as a bearer token"
        ),
        API_KEY_ENV,
    )
    common.add_argument("--timeout-s", type=float, default=60.0, help="timeout of each HTTP request")

    jobs: argparse.ArgumentParser = subparsers.add_parser(
        "jobs", help="submit bulk jobs to a running server and fetch their results"
    )
    sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="{submit,status,results,cancel}")

    submit = sub.add_parser("submit", parents=[common], help="submit a JSONL file of surface requests")
    submit.add_argument("file", type=Path, metavar="FILE.jsonl", help="one surface request per line")
    submit.add_argument("--model", required=True, help="served model name")
    # The server refuses a surface it does not take in bulk; the help lists those it does.
    bulk = ", ".join(surface.name for surface in REGISTRY if surface.bulk)
    submit.add_argument("--surface", required=True, help=f"one of: {bulk}")
    submit.add_argument(
        "--on-error",
        choices=("reject", "record"),
        default="reject",
        help="a malformed line refuses the job (reject) or becomes that line's error (record)",
    )
    submit.add_argument(
        "--idempotency-key", default=None, help="resubmitting with this key returns the same job"
    )
    submit.add_argument(
        "--wait", action="store_true", help="wait with a progress bar, then write the results"
    )
    submit.add_argument(
        "--output", type=Path, default=None, help="with --wait: write results JSONL here instead of stdout"
    )

    status = sub.add_parser("status", parents=[common], help="print a job's status and counts as JSON")
    status.add_argument("id", help="job id")

    results = sub.add_parser(
        "results", parents=[common], help="write a job's results as JSONL in input order"
    )
    results.add_argument("id", help="job id")
    results.add_argument("--output", type=Path, default=None, help="write here instead of stdout")

    cancel = sub.add_parser("cancel", parents=[common], help="cancel a job; prints its status as JSON")
    cancel.add_argument("id", help="job id")
    return jobs


def _check_output(output: Path | None) -> None:
    """Refuse an output path that cannot be written before any work is done."""
    if output is not None and not output.parent.is_dir():
        raise OSError(f"--output {str(output)!r}: the directory {str(output.parent)!r} does not exist")
    if output is not None and output.is_dir():
        raise OSError(f"--output {str(output)!r} is a directory")


def _dump(results: Iterable[dict[str, Any]], stream: TextIO) -> int:
    count = 0
    for result in results:
        stream.write(json.dumps(result, separators=(",", ":")) + "\n")
        count += 1
    return count


def _write_results(results: Iterable[dict[str, Any]], output: Path | None) -> int:
    """Results as JSONL on stdout, or into `output` only once all of them have arrived (written
    beside it, then renamed), so a failure leaves an existing file as it was."""
    if output is None:
        return _dump(results, sys.stdout)
    _check_output(output)
    if output.exists() and not output.is_file():  # /dev/null, a FIFO: written as it is
        with output.open("w", encoding="utf-8") as stream:
            return _dump(results, stream)
    partial = output.with_name(f".{output.name}.partial")
    try:
        with partial.open("w", encoding="utf-8") as stream:
            count = _dump(results, stream)
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    return count


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _submit(client: Any, args: argparse.Namespace) -> int:
    if args.output is not None and not args.wait:
        raise OSError("--output: results are written only with --wait (or use `jobs results ID --output`)")
    _check_output(args.output)
    body = args.file.read_bytes()
    if not body.strip():
        raise OSError(f"{str(args.file)!r} has no requests")
    job = client.submit_job(
        body,  # as bytes: the server's line numbers are the file's
        surface=args.surface,
        model=args.model,
        on_error=args.on_error,
        idempotency_key=args.idempotency_key,
    )
    # With results on stdout the id goes to stderr, so stdout stays pure JSONL.
    print(job["id"], file=sys.stderr if args.wait and args.output is None else sys.stdout, flush=True)
    if not args.wait:
        return 0
    bar = ProgressBar(sys.stderr)
    try:
        final = client.wait_job(job["id"], on_progress=bar.update)
    except KeyboardInterrupt:  # Ctrl-C stops the waiting, not the job
        final = None
    finally:
        bar.close()
    if final is None:
        print(f"interrupted; job {job['id']} goes on (`vllm-srun jobs status {job['id']}`)", file=sys.stderr)
        return 130
    _write_results(client.iter_job_results(job["id"]), args.output)
    if final["status"] != "completed":
        print(f"error: job {job['id']} ended {final['status']}", file=sys.stderr)
        return 1
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """Run a `jobs` subcommand; 2 with `error: ...` on stderr when the server refuses or is unreachable."""
    import httpx

    from vllm_srun.client import APIError, Client

    try:
        with Client(args.url, api_key=args.api_key, timeout_s=args.timeout_s) as client:
            if args.jobs_command == "submit":
                return _submit(client, args)
            if args.jobs_command == "status":
                _print_json(client.job(args.id))
            elif args.jobs_command == "results":
                status = client.job(args.id)
                written = _write_results(client.iter_job_results(args.id), args.output)
                if written < status["counts"]["total"]:
                    print(
                        f"warning: job {args.id} is {status['status']}: {written} of "
                        f"{status['counts']['total']} results so far",
                        file=sys.stderr,
                    )
            elif args.jobs_command == "cancel":
                _print_json(client.cancel_job(args.id))
            return 0
    except APIError as exc:
        print(f"error: {exc.message} ({exc.code}, HTTP {exc.status})", file=sys.stderr)
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        print(f"error: cannot reach the server at {args.url}: {exc}", file=sys.stderr)
    except ValueError as exc:  # the client refuses an endpoint that is no http(s):// or unix:// URL
        print(f"error: cannot reach the server at {args.url}: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """`vllm-srun jobs ...` on its own, for scripts and tests."""
    parser = Parser(prog="vllm-srun", description="Bulk jobs on a vllm-srun server.")
    add_jobs_parser(parser.add_subparsers(dest="command", required=True))
    return cmd_jobs(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
