"""`vllm-srun`: builds the parser from the subcommand modules and runs the one named.

Exit status: the command's own, or 2 with one `error: ...` line for a refused option or a
configuration error (no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from vllm_srun import __version__
from vllm_srun.cli import bench, check_config, fixture, inventory, jobs, proxy, secrets, serve, worker
from vllm_srun.cli.parsing import Parser
from vllm_srun.errors import SrunError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": serve.cmd_serve,
    "worker": worker.cmd_worker,
    "plugins": inventory.cmd_plugins,
    "devices": inventory.cmd_devices,
    "models": inventory.cmd_models,
    "fixture": fixture.cmd_fixture,
    "check-config": check_config.cmd_check_config,
    "proxy": proxy.cmd_proxy,
    "jobs": jobs.cmd_jobs,
    "init-secrets": secrets.cmd_init_secrets,
    "api-key": secrets.cmd_api_key,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="vllm-srun", description="Serve small encoder models over HTTP.")
    parser.add_argument("--version", action="version", version=f"vllm-srun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order --help lists them.
    serve.add_parsers(sub)
    worker.add_parsers(sub)
    proxy.add_parsers(sub)
    inventory.add_parsers(sub)  # plugins, devices, models
    fixture.add_parsers(sub)
    check_config.add_parsers(sub)
    secrets.add_parsers(sub)  # init-secrets, api-key
    bench.add_parsers(sub)
    jobs.add_jobs_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["bench"]:  # every option after it is the bench's (--quick, --texts N, ...)
            return bench.cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        from vllm_srun.logs import configure

        configure(getattr(args, "log_level", "warning") if args.command in ("serve", "worker") else "warning")
        return COMMANDS[args.command](args)
    except SrunError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
