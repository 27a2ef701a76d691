"""What the semantic router's supervisor needs of us when it starts us itself (managed mode).

The router runs `vllm-srun devices` to learn where `--device auto` would place a model, then
`vllm-srun serve --models FILE --uds PATH ...` once per process it plans, and speaks HTTP to
that socket alone. This module holds the two pieces of that which are not the server itself:
the devices report and the listening sockets (a unix socket, a TCP port, or both).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path
from typing import Any

from vllm_srun.errors import ConfigError

# Owner-only: the router and the runtime run as one user; nobody else may reach the socket.
UDS_MODE = 0o600


def devices_report(plugins: Any) -> dict[str, Any]:
    """Every installed accelerator's devices and the device `--device auto` takes.

    `{"auto": "cpu", "devices": ["cpu"], "accelerators": {"cpu": {"available": true,
    "auto_priority": 100, "devices": ["cpu"]}, ...}}`. The router reads `auto` (a device name
    such as `cpu` or `cuda:0`); `auto` is null when no accelerator offers a device for it.
    """
    from vllm_srun.registry.loader import resolve_device

    accelerators: dict[str, Any] = {}
    names: list[str] = []
    for name, entry in sorted(plugins.of("accelerators").items()):
        available = bool(entry.plugin.available())
        found = [d.name for d in entry.plugin.devices()] if available else []
        accelerators[name] = {
            "available": available,
            "auto_priority": entry.plugin.auto_priority,
            "devices": found,
        }
        names += found
    try:
        auto: str | None = resolve_device(plugins, "auto").name
    except ConfigError:
        auto = None
    return {"auto": auto, "devices": names, "accelerators": accelerators}


def unix_socket(path: Path, mode: int = UDS_MODE) -> socket.socket:
    """A stream socket bound at `path` with permissions `mode` from the moment it exists.

    A stale socket left at `path` (a process that died) is replaced; a socket someone listens
    on, or any other file, is refused, so a typo cannot take over someone's file.
    """
    path = path.expanduser()
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError(f"--uds {str(path)!r}: exists and is not a socket")
        if _answers(path):
            raise ConfigError(f"--uds {str(path)!r}: another process is listening there")
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bind() creates the file with the umask's permissions: a mask leaving only `mode` closes
    # the moment between bind and chmod in which another user could connect.
    previous = os.umask(0o777 & ~mode)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--uds {str(path)!r}: {exc.strerror or exc}") from exc
    finally:
        os.umask(previous)
    os.chmod(path, mode)
    return sock


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def tcp_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound at `host:port` (IPv6 when `host` is an IPv6 address), as uvicorn
    binds its own, but refused with a ConfigError that names the address."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def remove_socket(path: Path) -> None:
    """Remove the socket file `unix_socket` made, if it is still a socket."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(path.expanduser().lstat().st_mode):
            path.expanduser().unlink()


def file_mode(text: str) -> int:
    """An argparse type: permissions in octal (`600`, `0o660`), owner access required."""
    import argparse

    try:
        mode = int(text.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 600") from None
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        raise argparse.ArgumentTypeError(f"{text}: must be an octal mode in 600..777 the owner can use")
    return mode
