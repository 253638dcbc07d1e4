"""Real lockstepd processes and the Swift `lockstep` tool, for the interop tests.

The binaries come from the directory in $LOCKSTEP_BIN (default: /work/main/.build/debug, i.e. this
repository's debug build); `run.sh BIN_DIR` and `test_interop.py BIN_DIR` set it.
"""

from __future__ import annotations

import errno
import json
import os
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


def write_config(directory: str, heartbeat_ms: int = 200, digest_every: int = 10, **sections) -> str:
    """A TOML file for --config (keys as in deploy/lockstepd.toml)."""
    lines = ["[intervals]", f"heartbeat_ms = {heartbeat_ms}", f"digest_every_events = {digest_every}"]
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
    path = os.path.join(directory, "lockstepd.toml")
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")
    return path


class Daemon:
    """One lockstepd in a temporary directory, with ipc:// endpoints there."""

    def __init__(self, root: str, heartbeat_ms: int = 200, digest_every: int = 10, journal: str = "sqlite", **sections):
        self.root = root
        self.command = f"ipc://{root}/run/command"
        self.events = f"ipc://{root}/run/events"
        self.data_dir = os.path.join(root, "data")
        self.journal = journal
        self.heartbeat = heartbeat_ms / 1000.0
        self.config = write_config(root, heartbeat_ms, digest_every, **sections)
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
        self.process.wait(10)

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
        result = spawn(argv, subprocess.run, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr}")
        return result

    def swift_state(self, store: str) -> dict:
        """`lockstep state STORE --json`: store, epoch (hex), seq, digest (hex), state."""
        return json.loads(self.lockstep("state", store, "--json").stdout)

    def swift_dispatch_argv(self, store: str, *actions: str, repeat: int = 1) -> List[str]:
        return [
            binary("lockstep"), "dispatch", store, *actions,
            "--repeat", str(repeat), "--json", "--command-endpoint", self.command,
        ]


class TempRoot:
    """A short temporary directory (ipc paths must fit in sun_path, 107 bytes)."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="lsi-", dir="/tmp")

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)
