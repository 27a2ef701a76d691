"""compose.yaml's secrets, its services' own commands run as processes on files.

secret-init's command writes the files once and keeps them; the two Redis commands read the
password from theirs; app, worker and proxy start from their commands and environment, with the
volume's paths moved into a temporary directory and the service names onto loopback ports. The
key `vllm-srun api-key` prints is the one the stack takes, and no secret is on a command line.
"""

from __future__ import annotations

import os
import select
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from helpers import Proc, free_port, minilm_dir
from topology.test_compose import SECRETS_DIR, rendered, run_redis
from topology.test_compose import checkout as compose_checkout

# test_compose's fixture: a copy of the checkout's compose files, with no vllm-srun.env.
checkout = compose_checkout

CLI = [sys.executable, "-m", "vllm_srun.cli"]
FILES = ("api-keys", "redis-password", "redis-server-password")


def moved(values: list[str], secrets: Path, names: dict[str, str]) -> list[str]:
    """A command or environment value with the volume in `secrets` and hosts on loopback."""
    out = []
    for value in values:
        value = value.replace(SECRETS_DIR, str(secrets))
        for old, new in names.items():
            value = value.replace(old, new)
        out.append(value)
    return out


def init_command(services: dict[str, Any], secrets: Path) -> list[str]:
    """secret-init's command, owners made this test's user (only root may give a file away)."""
    command = moved(services["secret-init"]["command"], secrets, {})
    me = f"{os.getuid()}:{os.getgid()}"
    for flag in ("--owner", "--redis-owner"):
        command[command.index(flag) + 1] = me
    return [*CLI, *command]


def run_init(services: dict[str, Any], secrets: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SRUN_")}
    return subprocess.run(
        init_command(services, secrets), env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def snapshot(secrets: Path) -> dict[str, tuple[str, int, int]]:
    return {
        name: (
            (secrets / name).read_text(),
            stat.S_IMODE((secrets / name).stat().st_mode),
            (secrets / name).stat().st_uid,
        )
        for name in FILES
    }


def test_secret_init_generates_once_and_keeps_the_values_and_modes(checkout: Path, tmp_path: Path) -> None:
    services = rendered(checkout)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    first = run_init(services, secrets)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count(": generated") == 3
    made = snapshot(secrets)
    for name, (value, mode, uid) in made.items():
        assert mode == 0o600 and uid == os.getuid(), name
        assert len(value.strip()) == 64 and int(value, 16), "256 bits, as hex"
    assert made["redis-password"][0] == made["redis-server-password"][0] != made["api-keys"][0]
    second = run_init(services, secrets)
    assert second.returncode == 0 and second.stdout.count(": kept") == 3, second.stdout
    assert snapshot(secrets) == made
    # A value in vllm-srun.env replaces the generated one; an empty one keeps it.
    override = run_init(services, secrets, VLLM_SRUN_API_KEY="chosen-key", VLLM_SRUN_REDIS_PASSWORD="")
    assert override.returncode == 0, override.stderr
    after = snapshot(secrets)
    assert after["api-keys"] == ("chosen-key\n", 0o600, os.getuid())
    assert after["redis-password"] == made["redis-password"]


def test_secret_init_refuses_a_bad_value_naming_it(checkout: Path, tmp_path: Path) -> None:
    services = rendered(checkout)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    result = run_init(services, secrets, VLLM_SRUN_API_KEY="fine", VLLM_SRUN_REDIS_PASSWORD='has "quotes"')
    assert result.returncode == 2 and "VLLM_SRUN_REDIS_PASSWORD" in result.stderr
    assert not list(secrets.iterdir()), "nothing written, the good value neither"
    missing = run_init(services, tmp_path / "no-volume")
    assert missing.returncode == 2 and "no-volume is not a directory" in missing.stderr


def secret_env(service: dict[str, Any], secrets: Path) -> dict[str, str]:
    """The service's VLLM_SRUN_* variables (the files' paths), with the volume in `secrets`."""
    env = {k: v for k, v in service.get("environment", {}).items() if k.startswith("VLLM_SRUN_")}
    return {k: v.replace(SECRETS_DIR, str(secrets)) for k, v in env.items()}


def runtime_command(service: dict[str, Any], names: dict[str, str], **flags: str) -> list[str]:
    """A vllm-srun service's command, with the model the entrypoint adds and `flags` replaced."""
    command = moved(service["command"], Path(SECRETS_DIR), names)
    for flag, value in flags.items():
        command[command.index(flag) + 1] = value
    if command[0] in ("serve", "worker"):
        command.insert(1, str(minilm_dir()))
    return [*CLI, *command]


def wait_for(url: str, procs: list[Any], timeout_s: float = 90.0, **kwargs: Any) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in procs:
            assert proc.poll() is None if isinstance(proc, subprocess.Popen) else proc.alive(), getattr(
                proc, "log", str
            )()
        try:
            response = httpx.get(url, timeout=2, **kwargs)
            if response.status_code == 200:
                return response
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, [getattr(p, "log", str)()[-2000:] for p in procs]
        time.sleep(0.2)


def start_redis(service: dict[str, Any], secrets: Path, folder: Path) -> tuple[subprocess.Popen[str], int]:
    """A compose Redis service's command, once it says it accepts connections, and its port.
    Redis cannot bind a port of the OS's choosing, so the port is chosen just before the start
    and chosen again when another process took it meanwhile."""
    for _ in range(5):
        port = free_port()
        proc = run_redis(service["command"], port, secret_env(service, secrets), folder)
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 30
        while b"Ready to accept connections" not in seen and proc.poll() is None:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([proc.stdout], [], [], 0.2)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        if b"Ready to accept connections" in seen:
            return proc, port
        proc.wait(timeout=10)
        assert b"already in use" in seen, seen.decode(errors="replace")
    raise AssertionError("five ports taken in a row")


def start_stack(services: dict[str, Any], secrets: Path, tmp_path: Path, procs: list[Any]) -> tuple[str, str]:
    """Both Redis, an app, a worker and the proxy from their compose commands; the app's and the
    proxy's URLs. The app and the proxy bind ports of the OS's choosing (port 0), read back from
    the lines they print as they bind."""
    names = {}
    for name in ("state-redis", "cache-redis"):
        (tmp_path / name).mkdir()
        proc, port = start_redis(services[name], secrets, tmp_path / name)
        procs.append(proc)
        names[f"{name}:6379"] = f"127.0.0.1:{port}"

    def start(name: str, **flags: str) -> Proc:
        command = runtime_command(services[name], names, **flags)
        # exec'd, never forked: the test reads each one's own argv and environment
        proc = Proc(command, tmp_path / f"{name}.log", env=secret_env(services[name], secrets), fork=False)
        procs.append(proc)
        return proc

    app = start("app", **{"--host": "127.0.0.1", "--port": "0"})
    start("worker")
    names["http://app:8000"] = f"http://127.0.0.1:{app.listening_port()}"
    proxy = start("proxy", **{"--listen": "127.0.0.1:0"})
    return names["http://app:8000"], f"http://127.0.0.1:{proxy.listening_port()}"


def test_the_services_commands_run_on_the_secret_files(checkout: Path, tmp_path: Path) -> None:
    services = rendered(checkout)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    assert run_init(services, secrets).returncode == 0
    procs: list[Any] = []
    try:
        app, url = start_stack(services, secrets, tmp_path, procs)
        wait_for(app + "/health", procs)  # the proxy answers /health once a replica does
        wait_for(url + "/health", procs)
        # What the README tells the user to run (`docker compose exec -T app vllm-srun api-key`).
        printed = subprocess.run(
            [*CLI, "api-key"],
            env={**os.environ, **secret_env(services["app"], secrets)},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        assert printed == (secrets / "api-keys").read_text().strip()
        body = {"input": ["a sentence behind the key"]}
        assert httpx.post(url + "/v1/embeddings", json=body, timeout=60).status_code == 401
        answered = httpx.post(
            url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {printed}"}, timeout=60
        )
        assert answered.status_code == 200, answered.text
        password = (secrets / "redis-password").read_text().strip()
        pids = [proc.pid if isinstance(proc, subprocess.Popen) else proc.proc.pid for proc in procs]
        for pid in pids:
            seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
            assert password.encode() not in seen and printed.encode() not in seen, pid
    finally:
        for proc in reversed(procs):
            if isinstance(proc, subprocess.Popen):
                proc.terminate()
                proc.wait(timeout=10)
            else:
                proc.stop()
