"""Throwaway servers for tests: Redis, a Sentinel set, a Redis Cluster and PostgreSQL.

Each server runs from a private temporary directory on spare loopback ports (found by
binding port 0), never on the shared 6379 / 5432. Every class is a context manager whose
exit stops its processes and removes its directory, also when the test failed; an
``atexit`` hook kills whatever is still running if the interpreter ends without that.

Every wait is bounded: a server that does not come up in time raises ``ServerError``
with the tail of its log. A missing binary raises ``ServerUnavailable`` (the fixtures in
``server_fixtures.py`` turn it into a skip, or a failure under
``RATEKEEPER_REQUIRE_SERVICES=1``).

    with RedisServer() as server:
        server.pause()       # SIGSTOP: the store becomes slow
        server.resume()
        server.restart()     # same port, empty again (no persistence)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratekeeper.loadtest.process import free_port

__all__ = [
    "PostgresServer",
    "RedisCluster",
    "RedisServer",
    "SentinelSet",
    "ServerError",
    "ServerUnavailable",
    "free_port",
    "require_binary",
    "wait_until",
]

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
PG_BIN = Path(os.environ.get("RATEKEEPER_PG_BIN", "/usr/lib/postgresql/15/bin"))


class ServerUnavailable(RuntimeError):
    """A binary the server needs is not installed; the test cannot run here."""


class ServerError(RuntimeError):
    """A server did not start, stop or converge within its bounded wait."""


def require_binary(name: str, directory: Path | None = None) -> str:
    """The path of executable ``name`` (on PATH, or in ``directory``), else ``ServerUnavailable``."""
    if directory is not None:
        path = directory / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise ServerUnavailable(f"{name} is not in {directory} (install PostgreSQL 15: apt-get install postgresql-15)")
    found = shutil.which(name)
    if found is None:
        raise ServerUnavailable(f"{name} is not on PATH (install it: apt-get install redis-server redis-tools)")
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it returns true; ``ServerError`` naming ``what`` after ``timeout`` seconds.

    Exceptions from ``predicate`` count as "not yet" (a server that is still starting refuses
    connections); the last one is chained to the error.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            if predicate():
                return
        except Exception as exc:  # noqa: BLE001 - a server that is starting answers with errors
            last = exc
        if time.monotonic() >= deadline:
            raise ServerError(f"timed out after {timeout:.1f}s waiting for {what}") from last
        time.sleep(interval)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- process bookkeeping ------------------------------------------------------------------


class _Closable:
    """Something that owns processes and a directory; ``close()`` ends and removes them all."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


_live: set[_Closable] = set()
_live_lock = threading.Lock()


def _register(server: _Closable) -> None:
    with _live_lock:
        _live.add(server)


def _unregister(server: _Closable) -> None:
    with _live_lock:
        _live.discard(server)


@atexit.register
def _close_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live)
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.close()


def _spawn(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` with its output in ``log``; it is SIGKILLed if this process dies first.

    The parent-death signal (``setpriv --pdeathsig``, Linux) fires when the *thread* that
    started the child exits, so it is asked for only from the main thread (where fixtures
    run); elsewhere the atexit hook is the only safety net.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is not None and threading.current_thread() is threading.main_thread():
        args = [setpriv, "--pdeathsig", "KILL", "--", *args]
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def _redis_client(port: int, timeout: float = 2.0) -> redis.Redis:
    """A client that fails at once instead of retrying with backoff (redis-py's default), for bounded polls."""
    return redis.Redis(
        host=HOST, port=port, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


# --- Redis --------------------------------------------------------------------------------


class RedisServer(_Closable):
    """One ``redis-server`` on a spare loopback port, without persistence.

    ``start()`` returns once the server answers PING; ``restart()`` and ``start()`` after
    ``stop()`` / ``kill()`` reuse the same port, so clients holding ``url`` reconnect to it.
    ``extra_args`` are appended to the command line (``["--maxmemory", "10mb"]``);
    ``sentinel=True`` starts it as a Sentinel from ``config`` (a file it may rewrite).
    """

    def __init__(
        self,
        port: int | None = None,
        extra_args: Iterable[str] = (),
        *,
        directory: Path | None = None,
        config: str | None = None,
        sentinel: bool = False,
        name: str = "redis",
        start: bool = True,
    ) -> None:
        self._binary = require_binary("redis-server")
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args)
        self.name = name
        self._owns_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix=f"rk-{name}-")) if directory is None else directory
        self.log = self.dir / f"{name}.log"
        self._config_text = config
        self._sentinel = sentinel
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        _register(self)
        if start:
            try:
                self.start()
            except BaseException:
                self.close()
                raise

    # addresses
    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A new redis-py client for this server (the caller closes it)."""
        return _redis_client(self.port, timeout)

    def is_running(self) -> bool:
        """True while the process lives (also when paused)."""
        return self._proc is not None and self._proc.poll() is None

    # lifecycle
    def _command(self) -> list[str]:
        if self._sentinel:
            conf = self.dir / f"{self.name}.conf"
            if not conf.exists():
                conf.write_text(self._config_text or "")
            return [
                self._binary,
                str(conf),
                "--sentinel",
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--daemonize",
                "no",
                "--dir",
                str(self.dir),
                *self.extra_args,
            ]
        args = [self._binary]
        if self._config_text is not None:
            conf = self.dir / f"{self.name}.conf"
            conf.write_text(self._config_text)
            args.append(str(conf))
        return [
            *args,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
            "--protected-mode",
            "no",
            "--repl-diskless-sync-delay",
            "0",
            *self.extra_args,
        ]

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server (on its port) and wait until it answers PING."""
        if self.is_running():
            raise ServerError(f"{self.name} on port {self.port} is already running")
        for attempt in range(5):
            self._proc = _spawn(self._command(), self.log, self.dir)
            self._paused = False
            try:
                wait_until(self._answers_ping, timeout, f"{self.name} to answer PING on port {self.port}")
                return
            except ServerError as exc:
                port_taken = "Address already in use" in _tail(self.log, 5)
                self._reap(signal.SIGKILL)
                if port_taken and not self._fixed_port and attempt < 4:
                    self.port = free_port()  # lost a race for the port: only before the first start
                    continue
                raise ServerError(f"{exc}; log {self.log}:\n{_tail(self.log)}") from exc

    def _answers_ping(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            raise ServerError(f"{self.name} exited with status {self._proc.returncode if self._proc else None}")
        with self.client(timeout=0.5) as conn:
            return bool(conn.ping())

    def _reap(self, sig: signal.Signals, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if self._paused:
            proc.send_signal(signal.SIGCONT)
            self._paused = False
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM and wait until the process has exited (SIGKILL after ``timeout``)."""
        self._reap(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: the server vanishes at once, as in a crash."""
        self._reap(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung server)."""
        if not self.is_running():
            raise ServerError(f"{self.name} on port {self.port} is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        if self._proc is not None and self._paused:
            self._proc.send_signal(signal.SIGCONT)
            self._paused = False

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Stop (if running) and start again on the same port; the data is gone."""
        self.stop()
        self._fixed_port = True
        self.start(timeout)

    def close(self) -> None:
        """Kill the process and remove the directory (if this object created it)."""
        self.kill()
        if self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        _unregister(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} port={self.port} running={self.is_running()}>"


def _role(port: int) -> str:
    with _redis_client(port, 1.0) as conn:
        reply: Any = conn.execute_command("ROLE")
        role = reply[0]
        return role.decode() if isinstance(role, bytes) else str(role)


class SentinelSet(_Closable):
    """A master, one replica and three sentinels (quorum 2) monitoring ``service``.

    Sentinels run with down-after 1 s, failover-timeout 3 s, and faster internal periods
    (``SENTINEL DEBUG``: INFO every 250 ms, hello every 250 ms, no TILT on a loaded machine)
    so a failover completes, and the old master is demoted, within a few seconds; a master
    that hangs (``master().pause()``) or dies is replaced by the sentinels on their own.
    The constructor returns once every sentinel sees the master, the replica and the two
    other sentinels, so ``failover()`` can run at once.
    """

    SENTINELS = 3

    def __init__(self, service: str = "mymaster", timeout: float = 20.0) -> None:
        self.service = service
        self.dir = Path(tempfile.mkdtemp(prefix="rk-sentinel-"))
        self.redis: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []
        _register(self)
        try:
            master = RedisServer(directory=self.dir, name="node0")
            self.redis.append(master)
            self.redis.append(
                RedisServer(directory=self.dir, name="node1", extra_args=["--replicaof", HOST, str(master.port)])
            )
            for i in range(self.SENTINELS):
                config = (
                    f"sentinel resolve-hostnames no\n"
                    f"sentinel monitor {service} {HOST} {master.port} 2\n"
                    f"sentinel down-after-milliseconds {service} 1000\n"
                    f"sentinel failover-timeout {service} 3000\n"
                    f"sentinel parallel-syncs {service} 1\n"
                )
                sentinel = RedisServer(directory=self.dir, name=f"sentinel{i}", config=config, sentinel=True)
                self.sentinels.append(sentinel)
                with sentinel.client() as conn:
                    conn.execute_command(
                        "SENTINEL",
                        "DEBUG",
                        "info-period",
                        250,
                        "publish-period",
                        250,
                        "tilt-trigger",
                        60000,
                        "tilt-period",
                        1000,
                    )
            self.wait_ready(timeout)
        except BaseException:
            self.close()
            raise

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels]

    def sentinel_url(self, service: str | None = None) -> str:
        """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/<service>``."""
        hosts = ",".join(f"{HOST}:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{service or self.service}"

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``[(host, port), ...]`` of the sentinels, as ``redis.sentinel.Sentinel`` takes them."""
        return [(HOST, port) for port in self.sentinel_ports]

    def server_on(self, port: int) -> RedisServer:
        """The data node (master or replica) listening on ``port``."""
        for server in self.redis:
            if server.port == port:
                return server
        raise KeyError(f"no data node on port {port}")

    def master_port(self) -> int:
        """The master's port as the first sentinel that answers reports it."""
        last: Exception | None = None
        for sentinel in self.sentinels:
            try:
                return self._reported_master(sentinel)
            except (redis.RedisError, OSError) as exc:
                last = exc
        raise ServerError("no sentinel answered get-master-addr-by-name") from last

    def master(self) -> RedisServer:
        return self.server_on(self.master_port())

    def replica(self) -> RedisServer:
        """The data node that is not the master."""
        port = self.master_port()
        return next(server for server in self.redis if server.port != port)

    def _reported_master(self, sentinel: RedisServer) -> int:
        with sentinel.client(1.0) as conn:
            reply: Any = conn.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not reply:
            raise ServerError(f"sentinel {sentinel.port} does not know {self.service}")
        return int(reply[1])

    def _sentinel_sees_everything(self, sentinel: RedisServer, master_port: int) -> bool:
        if self._reported_master(sentinel) != master_port:
            return False
        with sentinel.client(1.0) as conn:
            replicas: Any = conn.execute_command("SENTINEL", "REPLICAS", self.service)
            others: Any = conn.execute_command("SENTINEL", "SENTINELS", self.service)
        healthy = [r for r in replicas if _field(r, "flags") == "slave" and _field(r, "master-link-status") == "ok"]
        return len(healthy) == len(self.redis) - 1 and len(others) == self.SENTINELS - 1

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until one node is master, the other replicates it, and every sentinel knows both and its peers."""

        def ready() -> bool:
            port = self.master_port()
            if _role(port) != "master":
                return False
            for server in self.redis:
                if server.port != port and _replica_link(server.port) != (port, "connected"):
                    return False
            return all(self._sentinel_sees_everything(s, port) for s in self.sentinels)

        wait_until(ready, timeout, "the sentinel set to agree on one master with a healthy replica", interval=0.1)

    def failover(self, timeout: float = 30.0, *, demote_old_master: bool = True) -> int:
        """``SENTINEL FAILOVER``, then wait until every sentinel reports the new master and it answers as master.

        With ``demote_old_master`` (the default) also wait until the old master has become a
        replica of the new one and the sentinels see it healthy, so the set is ready for the
        next failover and a write can only succeed on the new master. Returns the new port.
        """
        old = self.master_port()
        with self.sentinels[0].client() as conn:
            conn.execute_command("SENTINEL", "FAILOVER", self.service)
        new = self.wait_for_new_master(old, timeout)
        if demote_old_master:
            self.wait_ready(timeout)
        return new

    def wait_for_new_master(self, old: int, timeout: float = 30.0) -> int:
        """Wait until every sentinel reports a master other than port ``old`` and it answers
        ``ROLE`` as master (after ``failover()``, or a failover of their own once the master
        hangs or dies); return its port."""

        def switched() -> bool:
            ports = {self._reported_master(s) for s in self.sentinels}
            if len(ports) != 1 or old in ports:
                return False
            return _role(ports.pop()) == "master"

        wait_until(switched, timeout, f"every sentinel to report a new master instead of port {old}", interval=0.1)
        return self.master_port()

    def close(self) -> None:
        for server in [*self.sentinels, *self.redis]:
            server.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        _unregister(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _field(entry: Any, name: str) -> str:
    """A field of a SENTINEL REPLICAS / SENTINELS entry (a flat list or a dict, by protocol)."""
    if isinstance(entry, dict):
        value = entry.get(name, entry.get(name.encode()))
    else:
        items = [x.decode() if isinstance(x, bytes) else x for x in entry]
        value = dict(zip(items[::2], items[1::2], strict=True)).get(name)
    return value.decode() if isinstance(value, bytes) else str(value)


def _replica_link(port: int) -> tuple[int, str] | None:
    """``(master_port, link_state)`` of a replica, or None if the node is a master."""
    with _redis_client(port, 1.0) as conn:
        reply: Any = conn.execute_command("ROLE")
    role = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
    if role != "slave":
        return None
    state = reply[3].decode() if isinstance(reply[3], bytes) else reply[3]
    return int(reply[2]), state


class RedisCluster(_Closable):
    """Three cluster masters (no replicas) covering all 16384 slots.

    Each node has its own config file in the temp directory and an explicit bus port
    (``cluster-port``), so any spare port works. The constructor returns once ``CLUSTER
    INFO`` says ``cluster_state:ok`` on every node and every node knows all three.
    """

    def __init__(self, masters: int = 3, timeout: float = 30.0) -> None:
        cli = require_binary("redis-cli")
        self.dir = Path(tempfile.mkdtemp(prefix="rk-cluster-"))
        self.nodes: list[RedisServer] = []
        _register(self)
        try:
            for i in range(masters):
                node_dir = self.dir / f"node{i}"
                node_dir.mkdir()
                self.nodes.append(self._start_node(node_dir, f"node{i}"))
            create = subprocess.run(
                [cli, "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes), "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if create.returncode != 0:
                raise ServerError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
            wait_until(self._all_ok, timeout, "cluster_state:ok on every node", interval=0.1)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _start_node(node_dir: Path, name: str, attempts: int = 3) -> RedisServer:
        """A cluster-enabled node; a bus port taken meanwhile by someone else means new ports."""
        for attempt in range(attempts):
            try:
                return RedisServer(
                    directory=node_dir,
                    name=name,
                    extra_args=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(node_dir / "nodes.conf"),
                        "--cluster-port",
                        str(free_port()),
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            except ServerError:
                if attempt == attempts - 1 or "Address already in use" not in _tail(node_dir / f"{name}.log", 5):
                    raise
        raise AssertionError("unreachable")

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    def _all_ok(self) -> bool:
        for node in self.nodes:
            with node.client(1.0) as conn:
                info = conn.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(self.nodes)}" not in text:
                    return False
        return True

    def node_for_slot(self, slot: int) -> RedisServer:
        """The node that serves ``slot`` (0..16383)."""
        with self.nodes[0].client() as conn:
            shards: Any = conn.execute_command("CLUSTER", "SLOTS")
        for start, end, primary, *_ in shards:
            if int(start) <= slot <= int(end):
                return self._node_on(int(primary[1]))
        raise ServerError(f"no node serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The node that serves ``key``'s slot (honouring ``{hash tags}``)."""
        with self.nodes[0].client() as conn:
            slot = int(conn.execute_command("CLUSTER", "KEYSLOT", key))
        return self.node_for_slot(slot)

    def _node_on(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node on port {port}")

    @staticmethod
    def node_id(node: RedisServer) -> str:
        with node.client() as conn:
            return str(conn.execute_command("CLUSTER", "MYID").decode())

    def begin_slot_migration(self, slot: int, target: RedisServer) -> RedisServer:
        """Mark ``slot`` migrating from its owner to ``target`` and move its keys there (the
        owner still owns the slot: requests for keys that moved get ``-ASK``); returns the owner."""
        source = self.node_for_slot(slot)
        if source.port == target.port:
            raise ValueError(f"slot {slot} is already served by port {target.port}")
        with target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        with source.client() as src:
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
        return source

    def finish_slot_migration(self, slot: int, target: RedisServer, timeout: float = 10.0) -> None:
        """Give ``slot`` to ``target`` on every node and wait until every node agrees."""
        target_id = self.node_id(target)
        for node in [target, *(n for n in self.nodes if n.port != target.port)]:
            with node.client() as conn:
                conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

        def agreed() -> bool:
            for node in self.nodes:
                with node.client() as conn:
                    shards: Any = conn.execute_command("CLUSTER", "SLOTS")
                owner = next(int(p[1]) for start, end, p, *_ in shards if int(start) <= slot <= int(end))
                if owner != target.port:
                    return False
            return True

        wait_until(agreed, timeout, f"every node to agree that port {target.port} serves slot {slot}")

    def migrate_slot(self, slot: int, target: RedisServer) -> RedisServer:
        """Move ``slot`` and its keys to ``target`` (as ``redis-cli --cluster reshard`` does); returns the old owner."""
        source = self.begin_slot_migration(slot, target)
        self.finish_slot_migration(slot, target)
        return source

    def client(self) -> redis.RedisCluster:
        """A redis-py ``RedisCluster`` client (the caller closes it)."""
        return redis.RedisCluster(host=HOST, port=self.nodes[0].port, socket_timeout=2.0)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        _unregister(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- PostgreSQL ---------------------------------------------------------------------------

_template_lock = threading.Lock()
_template: dict[str, Path] = {}  # "data" -> the initdb'd directory every PostgresServer copies
_PG_USER = "postgres"


def _as_postgres(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL binary as the ``postgres`` OS user (initdb and postgres refuse root)."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", _PG_USER, "--", *args]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{' '.join(args)} did not finish within {timeout}s") from exc


def _chown_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user=_PG_USER, group=_PG_USER)


def _initdb_template() -> Path:
    """One initdb per test process; every PostgresServer starts from a copy (a copy takes ~0.1 s, initdb ~2 s)."""
    with _template_lock:
        if "data" not in _template or not _template["data"].exists():
            initdb = require_binary("initdb", PG_BIN)
            if os.geteuid() == 0:
                require_binary("runuser")
            root = Path(tempfile.mkdtemp(prefix="rk-pg-template-"))
            _chown_postgres(root)
            data = root / "data"
            done = _as_postgres(
                [
                    initdb,
                    "-D",
                    str(data),
                    "-A",
                    "trust",
                    "-U",
                    _PG_USER,
                    "-E",
                    "UTF8",
                    "--locale",
                    "C.UTF-8",
                    "--no-sync",
                    "--no-instructions",
                ],
                timeout=60,
            )
            if done.returncode != 0:
                shutil.rmtree(root, ignore_errors=True)
                raise ServerError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
            atexit.register(shutil.rmtree, root, True)
            _template["data"] = data
        return _template["data"]


class PostgresServer(_Closable):
    """A private PostgreSQL 15 on a spare loopback port, trust auth, ``fsync=off``.

    The data directory is a copy of one ``initdb`` made per test process, so a new server
    starts in about a second. ``pg_ctl`` runs as the ``postgres`` OS user; the unix socket
    lives in the temp directory, the log in ``log_path`` (``log_text()`` reads it, e.g. to
    count "deadlock detected"). ``stop()`` / ``start()`` / ``restart()`` keep the port and
    the data; ``pause()`` / ``resume()`` SIGSTOP / SIGCONT the postmaster and every backend.
    """

    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None, *, start: bool = True) -> None:
        self._pg_ctl = require_binary("pg_ctl", PG_BIN)
        self.port = port if port is not None else free_port()
        self._fixed_port = port is not None
        self.dir = Path(tempfile.mkdtemp(prefix="rk-pg-"))
        self.data = self.dir / "data"
        self.socket_dir = self.dir / "socket"
        self.log_path = self.dir / "postgres.log"
        self._paused: list[int] = []
        _register(self)
        try:
            _chown_postgres(self.dir)
            copy = subprocess.run(
                ["cp", "-a", str(_initdb_template()), str(self.data)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if copy.returncode != 0:
                raise ServerError(f"copying the initdb template failed: {copy.stderr}")
            self.socket_dir.mkdir()
            _chown_postgres(self.socket_dir)
            self.log_path.touch()
            _chown_postgres(self.log_path)
            conf = {
                "listen_addresses": f"'{HOST}'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self.socket_dir}'",
                "fsync": "off",
                "full_page_writes": "off",
                "log_lock_waits": "on",
                "deadlock_timeout": "'100ms'",
                "logging_collector": "off",
                "shared_buffers": "'32MB'",
                "max_connections": "200",
                **(settings or {}),
            }
            with (self.data / "postgresql.conf").open("a") as f:
                f.write("\n# ratekeeper tests\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
            if start:
                self.start()
        except BaseException:
            self.close()
            raise

    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql://{_PG_USER}@{HOST}:{self.port}/postgres"

    def _ctl(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return _as_postgres([self._pg_ctl, "-D", str(self.data), *args], timeout)

    def is_running(self) -> bool:
        return self._ctl("status", timeout=10).returncode == 0

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def start(self, timeout: float = 30.0) -> None:
        """Start (``pg_ctl start -w``) and return once it accepts connections on its port.

        Before the first successful start, a port taken meanwhile by someone else is
        replaced by another spare one; afterwards the port never changes.
        """
        for attempt in range(5):
            done = self._ctl("start", "-w", "-t", str(int(timeout)), "-l", str(self.log_path), timeout=timeout + 5)
            if done.returncode == 0:
                break
            if not self._fixed_port and attempt < 4 and "Address already in use" in _tail(self.log_path, 10):
                self.port = free_port()
                with (self.data / "postgresql.conf").open("a") as f:
                    f.write(f"port = {self.port}\n")  # the last setting wins
                continue
            raise ServerError(
                f"pg_ctl start failed on port {self.port}:\n{done.stdout}{done.stderr}\n"
                f"log {self.log_path}:\n{_tail(self.log_path)}"
            )
        wait_until(self._accepts, timeout, f"postgres to accept connections on port {self.port}")
        self._fixed_port = True

    def _accepts(self) -> bool:
        with socket.create_connection((HOST, self.port), timeout=1.0):
            return True

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """``pg_ctl stop -m fast|immediate|smart``; "immediate" is a crash (recovery on next start)."""
        if mode not in ("fast", "immediate", "smart"):
            raise ValueError(f"mode must be 'fast', 'immediate' or 'smart', got {mode!r}")
        self.resume()
        done = self._ctl("stop", "-m", mode, "-w", "-t", str(int(timeout)), timeout=timeout + 5)
        if done.returncode != 0 and self.is_running():
            raise ServerError(f"pg_ctl stop -m {mode} failed:\n{done.stdout}{done.stderr}")

    def restart(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Stop (``mode``) and start again on the same port; the data stays."""
        if self.is_running():
            self.stop(mode, timeout)
        self.start(timeout)

    def _processes(self) -> list[int]:
        """The postmaster and its children (backends, background workers)."""
        root = self.postmaster_pid()
        if root is None:
            return []
        pids = [root]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == root:
                pids.append(int(entry.name))
        return pids

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: connections hang, nothing answers."""
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self._paused.append(pid)

    def resume(self) -> None:
        """SIGCONT what ``pause()`` stopped."""
        paused, self._paused = self._paused, []
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def log_text(self) -> str:
        """Everything the server logged so far."""
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        """Stop immediately (if running) and remove the directory."""
        self.resume()
        if self.postmaster_pid() is not None:
            with contextlib.suppress(Exception):
                self._ctl("stop", "-m", "immediate", "-w", "-t", "10", timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)
        _unregister(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RatekeeperService(_Closable):
    """A private ``ratekeeper serve`` (this checkout's) on spare loopback ports, with the
    store API on (``--store-api``): ``admin_url`` is the URL a limiter takes to use it as
    its store. ``start()`` returns once ``/healthz`` answers. ``env`` is added to the
    process's environment."""

    def __init__(self, store: str = "memory://", args: Iterable[str] = (), env: dict[str, str] | None = None) -> None:
        self.http_port, self.grpc_port, self.admin_port = free_port(), free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rk-serve-"))
        self.log = self.dir / "serve.log"
        src = Path(__file__).resolve().parent.parent / "src"
        self._cmd = [
            sys.executable, "-m", "ratekeeper", "serve", "--store", store,
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--admin-port", str(self.admin_port), "--store-api", *args,
        ]  # fmt: skip
        self._env = {**os.environ, "PYTHONPATH": str(src), **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        _register(self)
        self.start()

    @property
    def url(self) -> str:
        """The decision surface."""
        return f"http://{HOST}:{self.http_port}"

    @property
    def admin_url(self) -> str:
        """The admin surface: reset, refund, metrics, and the store API (``Limiter(admin_url)``)."""
        return f"http://{HOST}:{self.admin_port}"

    def start(self) -> None:
        import httpx

        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(self._cmd, stdout=log, stderr=log, env=self._env, cwd=self.dir)
        proc = self._proc
        wait_until(
            lambda: proc.poll() is not None or httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200,
            timeout=30,
            what="ratekeeper serve",
        )
        if proc.poll() is not None:
            raise ServerError(f"ratekeeper serve exited with {proc.returncode}: {self.log.read_text()[-2000:]}")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
