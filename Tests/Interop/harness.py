"""Real lockstepd processes, the Swift `lockstep` tool and a throwaway PostgreSQL, for the interop tests.

The binaries come from the directory in $LOCKSTEP_BIN (default: .build/debug of this repository, its debug
build); `run.sh BIN_DIR` and `test_interop.py BIN_DIR` set it. PostgreSQL's come from Debian's `postgresql`
package (`/usr/lib/postgresql/VERSION/bin`, the newest) or `$PATH`.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional

from client import Dispatcher, NoReply

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def bin_dir() -> str:
    return os.environ.get("LOCKSTEP_BIN") or os.path.join(REPO, ".build", "debug")


def binary(name: str, wait: float = 60.0) -> str:
    """The path of a binary; a rebuild replaces them, so one briefly missing is waited for (bounded)."""
    path = os.path.join(bin_dir(), name)
    if not os.path.isdir(bin_dir()):
        raise FileNotFoundError(f"{bin_dir()} is not a directory (set LOCKSTEP_BIN to the directory of lockstepd)")
    deadline = time.monotonic() + wait
    while not os.access(path, os.X_OK):
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"{path} not found (set LOCKSTEP_BIN to the directory of lockstepd and lockstep)")
        time.sleep(0.2)
    return path


def spawn(argv: List[str], runner=subprocess.Popen, wait: float = 60.0, **options):
    """Starts a binary; while a rebuild is writing it (ETXTBSY) or has it removed (ENOENT), tries again, bounded."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return runner(argv, **options)
        except OSError as error:
            if error.errno not in (errno.ETXTBSY, errno.ENOENT) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def write_config(directory: str, heartbeat_ms: int = 200, digest_every: int = 10,
                 off_loop_bytes: Optional[int] = None, **sections) -> str:
    """A TOML file for --config (keys as in deploy/lockstepd.toml)."""
    lines = ["[intervals]", f"heartbeat_ms = {heartbeat_ms}", f"digest_every_events = {digest_every}"]
    if off_loop_bytes is not None:
        lines.append(f"checkpoint_off_loop_bytes = {off_loop_bytes}")
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
    path = os.path.join(directory, "lockstepd.toml")
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")
    return path


class Daemon:
    """One lockstepd in a temporary directory, with ipc:// endpoints there."""

    def __init__(
        self,
        root: str,
        heartbeat_ms: int = 200,
        digest_every: int = 10,
        off_loop_bytes: Optional[int] = None,
        journal: str = "sqlite",
        postgres: Optional[str] = None,
        name: Optional[str] = None,
        **sections,
    ):
        """`postgres` (a libpq connection string) and `name` (its name in the lease) are for `journal="postgres"`:
        several daemons on one database, one leading, the others standing by."""
        self.root = root
        self.postgres = postgres
        self.name = name
        self.command = f"ipc://{root}/run/command"
        self.events = f"ipc://{root}/run/events"
        self.data_dir = os.path.join(root, "data")
        self.journal = journal
        self.heartbeat = heartbeat_ms / 1000.0
        self.config = write_config(root, heartbeat_ms, digest_every, off_loop_bytes, **sections)
        self.process: Optional[subprocess.Popen] = None
        self.log_path = os.path.join(root, "lockstepd.log")
        self.starts = 0

    def start(self, data_dir: Optional[str] = None, journal: Optional[str] = None) -> "Daemon":
        if data_dir is not None:
            self.data_dir = data_dir
        if journal is not None:
            self.journal = journal
        assert self.process is None or self.process.poll() is not None, "already running"
        argv = [
            binary("lockstepd"),
            "--config", self.config,
            "--data-dir", self.data_dir,
            "--command-endpoint", self.command,
            "--events-endpoint", self.events,
            "--journal", self.journal,
            "--log-level", "notice",
        ]
        if self.postgres is not None:
            argv += ["--postgres", self.postgres]
        if self.name is not None:
            argv += ["--name", self.name]
        self.starts += 1
        log = open(self.log_path, "a")
        log.write(f"--- start {self.starts}: {' '.join(argv)}\n")
        log.flush()
        self.process = spawn(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"lockstepd exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with Dispatcher(self.command, timeout=0.3, retries=0) as client:
                    client.status()
                return
            except NoReply:
                continue
        raise RuntimeError(f"lockstepd did not answer STATUS within {timeout} s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path) as file:
                return "".join(file.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> Optional[int]:
        """Stops it with `sig` and waits (bounded); SIGKILL if it does not go. Returns the exit status."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGCONT)  # in case a test left it stopped
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise AssertionError(f"lockstepd did not stop within {timeout} s of signal {sig}")

    def kill9(self) -> None:
        self.process.kill()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"lockstepd (pid {self.process.pid}) did not die within 10 s of SIGKILL")

    def wait_role(self, role: str, timeout: float = 20.0) -> dict:
        """Its STATUS once `role` is "leader" or "standby" and it names a leader, polled for at most `timeout`."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"lockstepd {self.name} exited {self.process.returncode}: {self.log_tail()}")
            try:
                with Dispatcher(self.command, timeout=0.5, retries=0) as client:
                    last = client.status()
                if last.get("role") == role and last.get("leader"):
                    return last
            except NoReply:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"lockstepd {self.name} was not {role} within {timeout} s; last STATUS {last}; "
                                     f"log: {self.log_tail()}")
            time.sleep(0.05)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self) -> dict:
        with Dispatcher(self.command, timeout=2.0, retries=2) as client:
            return client.status()

    def store_status(self, name: str) -> dict:
        return next(s for s in self.status()["stores"] if s["name"] == name)

    # -- the Swift tool, against this daemon --

    def lockstep(self, *args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        argv = [binary("lockstep"), *args]
        if args and args[0] in ("dispatch", "state", "stats", "tail"):
            argv += ["--command-endpoint", self.command]
        return run_lockstep(argv, timeout, check)

    def swift_state(self, store: str) -> dict:
        """`lockstep state STORE --json`: store, epoch (hex), seq, digest (hex), state."""
        return json.loads(self.lockstep("state", store, "--json").stdout)

    def swift_dispatch_argv(self, store: str, *actions: str, repeat: int = 1) -> List[str]:
        return [
            binary("lockstep"), "dispatch", store, *actions,
            "--repeat", str(repeat), "--json", "--command-endpoint", self.command,
        ]


def run_lockstep(argv: List[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the `lockstep` tool (argv[0]), bounded; with `check`, a non-zero exit is an AssertionError."""
    result = spawn(argv, subprocess.run, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr}")
    return result


def journal_dump(postgres: str, store: str) -> List[dict]:
    """`lockstep journal dump --postgres CONNINFO --store STORE`: the journal's events, read from the database."""
    out = run_lockstep([binary("lockstep"), "journal", "dump", "--postgres", postgres, "--store", store]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


class PostgresServer:
    """A throwaway PostgreSQL, as Sources/LockstepTesting/PostgresServer.swift makes one: `initdb` into a new
    temporary folder, `postgres` in the foreground as this process's child on a Unix socket in that folder (no TCP
    port), stopped and the folder removed by `stop()`.

    `initdb` and `postgres` refuse to run as root, so as root they run as the `postgres` user (Debian's package
    makes it) through util-linux's `setpriv`, which execs the program in the same process: the PID this process
    holds is the server's own, and a signal to it reaches PostgreSQL. The folder is 0700 and the server's user's
    (root reaches the socket anyway); the server trusts every connection on it as its superuser, `postgres`.
    """

    USER = "postgres"
    SETPRIV = "/usr/bin/setpriv"

    def __init__(self, port: int = 5432):
        self.port = port  # on a Unix socket it only names the socket file (.s.PGSQL.PORT)
        self.folder: Optional[str] = None
        self.socket_dir: Optional[str] = None
        self.log_path: Optional[str] = None
        self.process: Optional[subprocess.Popen] = None
        self._user: Optional[tuple] = None  # (uid, gid) the server runs as, when this process is root
        self.bin = self.binaries()

    @staticmethod
    def binaries() -> str:
        """The newest /usr/lib/postgresql/VERSION/bin with initdb, else the directory of initdb on $PATH."""
        root = "/usr/lib/postgresql"
        versions = [int(v) for v in os.listdir(root) if v.isdigit()] if os.path.isdir(root) else []
        versions.sort(reverse=True)
        candidates = [os.path.join(root, str(v), "bin") for v in versions]
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(os.path.dirname(os.path.realpath(on_path)))
        tools = ("initdb", "postgres", "pg_isready", "psql")
        for directory in candidates:
            if all(os.access(os.path.join(directory, tool), os.X_OK) for tool in tools):
                return directory
        raise AssertionError(
            f"PostgreSQL is not installed: no {', '.join(tools)} in {root}/*/bin or on PATH, and this test needs a "
            f"throwaway server. Install Debian's postgresql (apt-get install postgresql; make deps, which make "
            f"test and make interop run, installs it)"
        )

    def _as_server_user(self, executable: str) -> List[str]:
        if self._user is None:
            return [executable]
        uid, gid = self._user
        return [self.SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", executable]

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        """Makes the cluster and starts the server; returns once it accepts connections (each step bounded)."""
        self._user = None
        if os.getuid() == 0:
            try:
                entry = pwd.getpwnam(self.USER)
            except KeyError:
                raise AssertionError(
                    f"running as root, and there is no '{self.USER}' user to run PostgreSQL as (initdb refuses "
                    f"root); install Debian's postgresql, which makes it, or run the tests as another user"
                ) from None
            if not os.access(self.SETPRIV, os.X_OK):
                raise AssertionError(f"running as root, and {self.SETPRIV} (util-linux) is missing: it runs "
                                     f"PostgreSQL as '{self.USER}'; install util-linux")
            self._user = (entry.pw_uid, entry.pw_gid)
        self.folder = tempfile.mkdtemp(prefix="lsi-pg-", dir="/tmp")  # 0700
        self.socket_dir = os.path.join(self.folder, "socket")
        os.mkdir(self.socket_dir, 0o700)
        if self._user is not None:
            for path in (self.folder, self.socket_dir):
                os.chown(path, *self._user)
        data = os.path.join(self.folder, "data")
        self.log_path = os.path.join(self.folder, "log")
        initdb = subprocess.run(
            self._as_server_user(os.path.join(self.bin, "initdb"))
            + ["-D", data, "-U", self.USER, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
            cwd=self.folder, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if initdb.returncode != 0:
            raise AssertionError(f"initdb into {data} failed (status {initdb.returncode}): {initdb.stderr}")
        options = {
            "listen_addresses": "", "unix_socket_directories": self.socket_dir, "port": str(self.port),
            "max_connections": "50", "logging_collector": "off", "unix_socket_permissions": "0700",
            "fsync": "off",  # a throwaway server: durability is not what the tests check
        }
        argv = self._as_server_user(os.path.join(self.bin, "postgres")) + ["-D", data]
        for key, value in sorted(options.items()):
            argv += ["-c", f"{key}={value}"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"postgres exited {self.process.returncode} at start; its log, {self.log_path}:\n"
                                     f"{self.log_tail()}")
            ready = subprocess.run(
                [os.path.join(self.bin, "pg_isready"), "-q", "-h", self.socket_dir, "-p", str(self.port),
                 "-U", self.USER, "-d", "postgres"],
                capture_output=True, timeout=10, stdin=subprocess.DEVNULL,
            )
            if ready.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"postgres did not accept connections within {timeout} s; its log:\n"
                                     f"{self.log_tail()}")
            time.sleep(0.05)

    def connection(self, database: str) -> str:
        """A libpq connection string for `database` on this server, as its superuser."""
        return f"host={self.socket_dir} port={self.port} user={self.USER} dbname={database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Runs one SQL statement with psql (bounded); its output, unaligned and without headers."""
        result = subprocess.run(
            [os.path.join(self.bin, "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-d", self.connection(database), "-c", statement],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise AssertionError(f"psql {statement!r} on {database} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def create_database(self, name: str = "lockstep") -> str:
        """Creates an empty database and returns its connection string."""
        self.sql(f"CREATE DATABASE {name}")
        return self.connection(name)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path) as file:
                return "".join(file.readlines()[-lines:])
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT), after 10 s immediate (SIGQUIT), after 5 s more SIGKILL, to the server's PID;
        then the folder is removed. Harmless twice, and after a failed start."""
        process, self.process = self.process, None
        try:
            if process is not None and process.poll() is None:
                for sig, wait in ((signal.SIGINT, 10), (signal.SIGQUIT, 5), (signal.SIGKILL, 5)):
                    process.send_signal(sig)
                    try:
                        process.wait(wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None


class TempRoot:
    """A short temporary directory (ipc paths must fit in sun_path, 107 bytes)."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="lsi-", dir="/tmp")

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)
