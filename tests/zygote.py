"""A process that has imported what every `vllm-srun` process imports (torch, Litestar, arq,
the engines and plugins) and forks one child per launch, so that a test's server or worker
starts without paying those imports again: most of a tiny model's start (docs/development.md).

Each child is what `python -m vllm_srun.cli ARGS` would be: `vllm_srun.cli` run as `__main__`
with that argv, in the same working directory, its output on the file the test opened, and
the interpreter's exit at the end (non-daemon threads joined, atexit handlers run; the teardown
of every module's objects is left to the kernel). What the
fork cannot give, `helpers.Proc` does not ask of it: a launch whose environment differs from
the one this process started with (an env override, a variable a test set since) is started
with exec as before, because modules read some variables as they are imported; so is every
command that is not `vllm_srun.cli`. The one difference it takes is PYTHONPATH (the folder of
a test's plugin distribution), put on the child's sys.path where the interpreter would put it,
unless that folder holds a module this process has already imported.

The protocol, one connection per launch on this process's unix socket: the test sends a JSON
line (`argv`, `cwd`, `pythonpath`) with the descriptors of its stdout and stderr beside it
(SCM_RIGHTS; one for both when they are one log file); this process
answers `{"pid": N}` once it has forked (or `{"exec": true}`: start this one with exec), and `{"returncode": N}` (Popen's convention: -signal
for a child killed by a signal) when that child exits, then closes the connection. It exits
when its stdin (a pipe from the test process) closes, so it never outlives the run.

Safe to fork because nothing here has started a thread pool or an event loop: importing torch
does not start its intra-op threads (the first operation does), and this process runs none.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import pkgutil
import selectors
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What `vllm-srun serve`/`worker` import for the fixtures the suite serves (as
# PYTHONPROFILEIMPORTTIME lists them for a tiny BERT server; torch the most of it). Nothing here
# reads a variable a test changes: those launches are exec'd (module docstring).
PRELOAD = (
    "vllm_srun.cli.main",
    "vllm_srun.app.main",
    "vllm_srun.app.routes",
    "litestar.plugins.pydantic",
    "vllm_srun.plugins.discovery",
    "vllm_srun.registry.loader",
    "vllm_srun.queue.worker.device_worker",
    "vllm_srun.engines.native.engine",
    "vllm_sr_example",
    "torch",
    "tokenizers",
    "safetensors",
    "numpy",
    "uvicorn",
    "uvloop",
    "httptools",
)


def preload() -> None:
    """PRELOAD, every route module, and the module of every installed plugin's entry point
    (imported only: discovery itself runs in each child, as it would)."""
    from importlib.metadata import entry_points

    from vllm_srun.plugins.discovery import ARCHITECTURES, GROUPS

    for name in PRELOAD:
        importlib.import_module(name)
    routes = importlib.import_module("vllm_srun.app.routes")
    for info in pkgutil.iter_modules(routes.__path__, "vllm_srun.app.routes."):
        importlib.import_module(info.name)
    for group in [ARCHITECTURES[1], *(ep_group for ep_group, _ in GROUPS.values())]:
        for ep in entry_points(group=group):
            try:
                importlib.import_module(ep.module)
            except Exception:  # a broken plugin is the child's discovery's to report
                pass
    imported = [name for name in NOT_PRELOADED if name in sys.modules]
    if imported:
        raise SystemExit(f"the zygote imported {imported}, which it must not: launches are exec'd")


# Never imported here: a child forked after `import onnxruntime` hangs as its interpreter exits
# (measured: every child of a process that had imported it, none of one that had not). A child
# that serves an ONNX graph imports it itself, after the fork.
NOT_PRELOADED = ("onnxruntime",)


class ChildLaunch(Exception):
    """Raised in a forked child to leave the serving loop: the child runs its command from the
    top of this module, with nothing of the loop's frames or descriptors left."""

    def __init__(self, argv: list[str], cwd: str, pythonpath: str | None) -> None:
        super().__init__()
        self.argv = argv
        self.cwd = cwd
        self.pythonpath = pythonpath


def _shadowed(pythonpath: str | None) -> bool:
    """Whether a launch's own PYTHONPATH holds a module this process has imported (a plugin
    installed into a folder of its own, say): the child would run this process's copy where
    exec would import that one, so such a launch is exec'd."""
    for entry in (pythonpath or "").split(os.pathsep):
        if entry and os.path.isdir(entry):
            for name in os.listdir(entry):
                module = name.removesuffix(".py").split(".")[0]
                # a sitecustomize runs as the interpreter starts, which a fork never does
                if module in sys.modules or module in ("sitecustomize", "usercustomize"):
                    return True
    return False


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}
    print("zygote ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not sys.stdin.buffer.read1(4096):
                    return
            elif key.data == "child":
                os.read(wake_r, 4096)
                _reap(children)
            else:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 65536, 2)
                request = json.loads(message)
                if _shadowed(request["pythonpath"]):
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(b'{"exec": true}\n')
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    selector.close()
                    listener.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    for other in children.values():
                        other.close()
                    os.dup2(fds[0], 1)
                    os.dup2(fds[-1], 2)
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    raise ChildLaunch(request["argv"], request["cwd"], request["pythonpath"])
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            try:
                conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            except OSError:
                pass  # the test no longer waits on it
            conn.close()


def run_child(launch: ChildLaunch) -> None:
    """The child: `python -m vllm_srun.cli ARGV` from here on, to the interpreter's exit."""
    import runpy

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # fd 0 lives as long as the process
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(launch.cwd)
    sys.path[0] = launch.cwd
    if launch.pythonpath is not None:
        # where exec would put them: after the working directory, ahead of the rest
        os.environ["PYTHONPATH"] = launch.pythonpath
        sys.path[1:1] = [entry for entry in launch.pythonpath.split(os.pathsep) if entry]
        importlib.invalidate_caches()
    sys.argv = [str(REPO / "vllm_srun" / "cli" / "__main__.py"), *launch.argv]
    # run as __main__ afresh, as -m does (a module already imported would make runpy warn)
    sys.modules.pop("vllm_srun.cli.__main__", None)
    interrupted = False
    try:
        runpy.run_module("vllm_srun.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:
        traceback.print_exc()
        code = 1
    # The interpreter's exit without its teardown: non-daemon threads joined and atexit's
    # handlers run, as at any exit, but not the freeing of every module's objects, which
    # takes a process that has imported torch most of a second, at every stop.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if interrupted:  # as the interpreter ends on an uncaught KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(value: object) -> int:
    """The status `sys.exit(value)` ends an interpreter with."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    # As `python -m vllm_srun.cli` run from the repository sees it: the working directory first
    # on sys.path, not this file's folder.
    sys.path[0] = str(REPO)
    preload()
    try:
        serve(sys.argv[1])
    except ChildLaunch as launch:
        run_child(launch)
