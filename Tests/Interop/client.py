"""A Lockstep client in Python: a Lazy Pirate dispatcher and a replica, from docs/protocol.md.

- `Dispatcher`: REQ (or DEALER) requests with a timeout; a silent daemon is asked again on a fresh socket
  with the same request id (the idempotency key), a bounded number of times ("Idempotency").
- `Replica`: the replica procedure of docs/protocol.md ("The replica procedure"), on its own thread with a
  SUB and a DEALER socket: subscribe first, keep events, SNAPSHOT, drop kept events <= its seq, apply in
  order, repair gaps by RANGE (asking again when a reply ends short; COMPACTED -> SNAPSHOT), heartbeats
  (a gap up to the heartbeat's seq), digests (compare; a mismatch -> report and resync), a new epoch -> resync.
  Silence for 3 heartbeat intervals is no resync: the replica keeps its state, says it is disconnected, and asks
  for the events from the last it holds on (RANGE last..MAX_SEQ, SNAPSHOT at seq 0); another epoch or
  `invalid_range` in the answer resyncs. A SNAPSHOT or RANGE repeated after a timeout waits twice as long each time
  in a row (up to 8 timeouts); one sent again after a standby's `not_leader` keeps its first send's timeout. `drop_next_events(n)` loses events on purpose, to force a gap.
- `LeaderSearch`: both take one daemon or every daemon of a failover group (docs/protocol.md, "Failover"). The
  replica subscribes to every daemon's events; requests go to one daemon at a time, and move to the next on a
  silence, or at once on ERROR `not_leader`, which ends no try; when every daemon that answers said `not_leader`,
  they are asked again after 200 ms. Given one daemon, a `not_leader` is asked again there after 200 ms (a lone
  standby may take over).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import zmq

import lockstep_wire as wire
from domains import Domain, Undecodable

log = logging.getLogger("lockstep.interop")
log.addHandler(logging.NullHandler())  # quiet unless the application configures logging


class NoReply(Exception):
    """Every try of a request went unanswered, or was refused `not_leader` (no daemon would lead)."""


LEADER_PAUSE = 0.2  # seconds: how long to wait when every daemon that answers said not_leader


class LeaderSearch:
    """Which daemon of a failover group requests go to, and where they go next (docs/protocol.md, "Failover").

    No socket and no clock: the owner tells it what happened. A silence (a request's timeout passed) moves to the
    next daemon; `not_leader` moves at once to the next daemon that has neither said `not_leader` nor gone silent
    since a leader last answered; when every daemon that answers has said `not_leader`, they are asked again after
    `LEADER_PAUSE`, from the next one on. A daemon that went silent is asked again in turn after the next timeout, so
    one that comes back is found. With one endpoint the search stays on it.
    """

    def __init__(self, endpoints: List[str]):
        if not endpoints:
            raise ValueError("a leader search needs at least one endpoint; got an empty list")
        self.endpoints = list(endpoints)
        self.current = 0
        self._silent: set = set()  # let a timeout pass, without a word, since a leader last answered
        self._standing_by: set = set()  # said not_leader since a leader last answered: alive
        self._refusing: set = set()  # said not_leader in this pass

    @property
    def endpoint(self) -> str:
        return self.endpoints[self.current]

    def answered(self) -> None:
        """The current daemon answered with anything but `not_leader`: it leads (or serves alone)."""
        self._silent.clear()
        self._standing_by.clear()
        self._refusing.clear()

    def timed_out(self) -> None:
        """The current daemon let a request's timeout pass: requests go to the next one."""
        if self.current not in self._standing_by:
            self._silent.add(self.current)
        self.current = (self.current + 1) % len(self.endpoints)

    def not_leader(self) -> float:
        """The current daemon answered `not_leader`: requests go to the next that may lead. Returns how long to wait
        before sending there: 0 while a daemon not asked in this pass is left, `LEADER_PAUSE` when every daemon that
        answers has said `not_leader`."""
        count = len(self.endpoints)
        self._refusing.add(self.current)
        self._standing_by.add(self.current)
        self._silent.discard(self.current)
        others = [(self.current + step) % count for step in range(1, count + 1)]  # the current one last
        for index in others:
            if index not in self._refusing and index not in self._silent:
                self.current = index
                return 0.0
        self._refusing.clear()
        # The current one is not silent, so there is always one.
        self.current = next(index for index in others if index not in self._silent)
        return LEADER_PAUSE


def configure_curve(sock: zmq.Socket, curve: tuple) -> None:
    """Makes `sock` a CURVE client: `curve` is (server public key, client public key, client secret key), Z85."""
    server, public, secret = (key.encode() if isinstance(key, str) else key for key in curve)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def endpoint_list(endpoints, what: str) -> List[str]:
    """One endpoint (a str) or several (a list or tuple of str), as a list; a clear error for anything else."""
    if isinstance(endpoints, str):
        return [endpoints]
    endpoints = list(endpoints)
    if not endpoints or not all(isinstance(e, str) and e for e in endpoints):
        raise ValueError(f"{what}: give one endpoint or a list of endpoints (non-empty strings); got {endpoints!r}")
    return endpoints


class Dispatcher:
    """Sends requests and waits for their replies, Lazy Pirate style.

    Each dispatch gets a new request number (1, 2, 3, … per client id); a retry after a silence uses the
    same one, so the daemon applies the dispatch at most once. An ERROR `unavailable` is retried later with the
    same key too (the spec: "retry later with the same key"), `unavailable_retries` times.

    `endpoints` is one daemon's command endpoint or the command endpoints of every daemon of a failover group.
    With several, the leader is found by asking (`LeaderSearch`): a silence or an ERROR `not_leader` moves the
    request to the next daemon on a fresh socket, with the same request id; a `not_leader` ends no try, so a
    request is given up after `retries` + 1 timeouts. With one, a `not_leader` (a lone standby, which may take
    over) is asked again after the same 200 ms pause, within the tries.
    """

    def __init__(
        self,
        endpoints,
        context: Optional[zmq.Context] = None,
        client_id: Optional[bytes] = None,
        timeout: float = 2.0,
        retries: int = 3,
        socket_type: int = zmq.REQ,
        unavailable_retries: int = 5,
        curve: Optional[tuple] = None,
    ):
        self.search = LeaderSearch(endpoint_list(endpoints, "Dispatcher"))
        self.context = context or zmq.Context.instance()
        self.client_id = client_id or os.urandom(wire.CLIENT_ID_BYTES)
        self.timeout = timeout
        self.retries = retries
        self.socket_type = socket_type
        self.unavailable_retries = unavailable_retries
        self.curve = curve  # (server public key, client public key, client secret key), Z85, for tcp endpoints
        self.next_request_id = 1
        self.socket: Optional[zmq.Socket] = None
        self.resends = 0  # requests sent again after a silence
        self.sockets_opened = 0
        self.refusals = 0  # ERROR not_leader answers that moved a request to another daemon

    @property
    def endpoint(self) -> str:
        """The command endpoint requests go to now."""
        return self.search.endpoint

    @property
    def endpoints(self) -> List[str]:
        return self.search.endpoints

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _open(self) -> zmq.Socket:
        if self.socket is None:
            self.socket = self.context.socket(self.socket_type)
            self.socket.setsockopt(zmq.LINGER, 0)
            if self.curve is not None:
                configure_curve(self.socket, self.curve)
            self.socket.connect(self.endpoint)
            self.sockets_opened += 1
        return self.socket

    def new_request_id(self) -> int:
        request_id = self.next_request_id
        self.next_request_id += 1
        return request_id

    def _send(self, body: List[bytes]) -> zmq.Socket:
        sock = self._open()
        sock.send_multipart(([b""] if self.socket_type == zmq.DEALER else []) + body)
        return sock

    def call_frames(self, body: List[bytes], request_id: int) -> wire.Reply:
        """Sends a request body and returns the decoded reply to it (or raises NoReply)."""
        several = len(self.endpoints) > 1
        refusal: Optional[wire.Error] = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.resends += 1
            sock = self._send(body)
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1):
                    break
                frames = sock.recv_multipart()
                if self.socket_type == zmq.DEALER:
                    if not frames or frames[0] != b"":
                        raise wire.WireError(wire.MALFORMED, "a DEALER reply must start with an empty frame")
                    frames = frames[1:]
                reply = wire.decode_reply(frames)
                if reply.request_id not in (request_id, 0):
                    continue  # a late reply to an earlier request (DEALER only): not ours
                if isinstance(reply, wire.Error) and reply.code == wire.NOT_LEADER:
                    # A standby: nothing applied. The request goes on at the next daemon that may lead (with one
                    # daemon, the same one), in this try (a not_leader ends no try), after a pause when every daemon
                    # that answers refused.
                    refusal = reply
                    self.refusals += 1
                    pause = self.search.not_leader()
                    self.close()
                    if pause > 0:
                        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                        if time.monotonic() >= deadline:
                            break
                    sock = self._send(body)
                    continue
                self.search.answered()
                return reply
            # Silence: this socket may hold a lost request; a REQ cannot send again. Start afresh, at the next
            # daemon when there are several.
            self.search.timed_out()
            self.close()
        tries = f"{self.retries + 1} tries of {self.timeout} s"
        daemons = ", ".join(self.endpoints)
        if refusal is None:
            if not several:
                raise NoReply(f"no reply from {self.endpoint} after {tries}; is the daemon running, and is the "
                              f"endpoint right?")
            raise NoReply(f"no reply from any of the daemons at {daemons} after {tries}; are they running, and are "
                          f"the endpoints right?")
        which = f"no daemon at {daemons}" if several else f"the daemon at {daemons}"
        raise NoReply(f"{which} would lead after {tries} (the last said: {refusal.reason}); is a leader running, and "
                      f"can the standbys reach the journal's database to take over?")

    def call(self, request: wire.Request) -> wire.Reply:
        return self.call_frames(wire.encode_request(request), request.request_id)

    def dispatch(
        self,
        store: str,
        actions: List[bytes],
        domain_version: int = 1,
        request_id: Optional[int] = None,
    ) -> wire.Reply:
        """One DISPATCH: ACCEPTED, REJECTED or ERROR. `request_id` given = a deliberate retry of that key."""
        if request_id is None:
            request_id = self.new_request_id()
        request = wire.Dispatch(request_id, domain_version, self.client_id, store, [bytes(a) for a in actions])
        delay = 0.05
        for attempt in range(self.unavailable_retries + 1):
            reply = self.call(request)
            # call() has followed not_leader itself, within its tries.
            if not (isinstance(reply, wire.Error) and reply.code == wire.UNAVAILABLE):
                return reply
            if attempt < self.unavailable_retries:
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        return reply

    def snapshot(self, store: str) -> wire.Reply:
        return self.call(wire.SnapshotRequest(self.new_request_id(), store))

    def range(self, store: str, from_seq: int, to_seq: int) -> wire.Reply:
        return self.call(wire.RangeRequest(self.new_request_id(), store, from_seq, to_seq))

    def effects(self, command: str = "list", effect_id: Optional[str] = None) -> wire.Reply:
        """EFFECTS: the leader's effects and timers (list), or a dead letter sent back to run (retry) or an effect
        dropped (drop), by its id store/seq/index: an EFFECTS reply (its JSON the listing after the change) or ERROR
        (unknown_effect when the id names nothing the command can act on)."""
        return self.call(wire.EffectsRequest(self.new_request_id(), command, effect_id))

    def status(self) -> Dict[str, Any]:
        """The STATUS of the daemon requests go to now (a standby answers STATUS too, with role standby)."""
        reply = self.call(wire.StatusRequest(self.new_request_id()))
        if not isinstance(reply, wire.Status):
            raise AssertionError(f"STATUS to {self.endpoint} answered with {reply}")
        return reply.json


@dataclass
class ReplicaStatus:
    phase: str
    epoch: Optional[int]
    seq: int
    daemon_seq: int
    digest: bytes
    state_bytes: bytes
    resyncs: List[str]
    divergences: List[tuple]
    repairs: int
    snapshots: int
    compacted: int
    problems: List[str]
    errors: List[str]
    dropped: int
    disconnected: bool  # nothing heard for the silence limit, and nothing since
    silences: int  # times the silence limit passed
    probes: int  # silences that sent a request for the last event held (none was out)
    moves: List[tuple]  # (from endpoint, to endpoint, why): the command socket moved to another daemon
    endpoint: str  # the command endpoint requests go to now


def daemon_list(daemons) -> List[tuple]:
    """One daemon's (command, events) endpoints, or a list of them, as a list of pairs; a clear error otherwise."""
    if isinstance(daemons, tuple) and len(daemons) == 2 and all(isinstance(e, str) for e in daemons):
        return [daemons]
    daemons = list(daemons)
    if not daemons or not all(
        isinstance(d, (tuple, list)) and len(d) == 2 and all(isinstance(e, str) and e for e in d) for d in daemons
    ):
        raise ValueError(
            f"Replica: give one daemon's (command endpoint, events endpoint) or a list of such pairs; got {daemons!r}"
        )
    return [tuple(d) for d in daemons]


class Replica:
    """A copy of one store, kept by the replica procedure of docs/protocol.md.

    `daemons` is one daemon's (command endpoint, events endpoint), or a list of them: every daemon of a failover
    group. The SUB socket connects to every events endpoint (only the leader publishes); the DEALER to the command
    endpoint `LeaderSearch` points at, moving on a request's timeout, or on ERROR `not_leader` when there are
    several daemons.
    """

    def __init__(
        self,
        domain: Domain,
        daemons,
        context: Optional[zmq.Context] = None,
        heartbeat_interval: float = 1.0,
        request_timeout: float = 2.0,
        keep_log: bool = False,
        name: str = "replica",
    ):
        self.domain = domain
        self.store = domain.name
        self.daemons = daemon_list(daemons)
        self.search = LeaderSearch([command for command, _ in self.daemons])
        self.events_endpoints = [events for _, events in self.daemons]
        self.context = context or zmq.Context.instance()
        self.heartbeat_interval = heartbeat_interval
        self.silence_limit = 3 * heartbeat_interval
        self.request_timeout = request_timeout
        self.keep_log = keep_log
        self.name = name
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.next_request_id = 1
        # Test hooks
        self._drop_events = 0
        self.dropped = 0
        # Observations
        self.resync_reasons: List[str] = []
        self.divergences: List[tuple] = []
        self.problems: List[str] = []  # what the daemon sent that the spec does not allow
        self.errors: List[str] = []  # ERROR replies to SNAPSHOT and RANGE (busy, unknown store, …)
        self.repairs = 0
        self.snapshots = 0
        self.compacted = 0
        self.disconnected = False
        self.silences = 0
        self.probes = 0
        self.moves: List[tuple] = []
        self.log: Dict[int, bytes] = {}
        self._divergence_streak = 0
        self._last_divergence: Optional[float] = None
        self._reset(time.monotonic())
        self.phase = "joining"

    # -- life ----------------------------------------------------------------------------------------

    def start(self) -> "Replica":
        self._thread = threading.Thread(target=self._run, name=f"{self.name}:{self.store}", daemon=True)
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("replica thread did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- test hooks ----------------------------------------------------------------------------------

    def drop_next_events(self, count: int) -> None:
        """Lose the next `count` EVENT messages on arrival, as a slow subscriber would."""
        with self.lock:
            self._drop_events = count

    def tamper(self, change: Callable[[Any], None]) -> None:
        """Change the local state behind the replica's back (a buggy reducer), to test divergence."""
        with self.lock:
            change(self.state)

    # -- observation ---------------------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        with self.lock:
            if self._error is not None:
                raise RuntimeError(f"the replica thread failed: {self._error!r}")
            state_bytes = self.domain.encode(self.state)
            return ReplicaStatus(
                phase=self.phase,
                epoch=self.epoch,
                seq=self.last,
                daemon_seq=self.daemon_seq,
                digest=wire.digest(state_bytes),
                state_bytes=state_bytes,
                resyncs=list(self.resync_reasons),
                divergences=list(self.divergences),
                repairs=self.repairs,
                snapshots=self.snapshots,
                compacted=self.compacted,
                problems=list(self.problems),
                errors=list(self.errors),
                dropped=self.dropped,
                disconnected=self.disconnected,
                silences=self.silences,
                probes=self.probes,
                moves=list(self.moves),
                endpoint=self.search.endpoint,
            )

    def wait_for(self, predicate: Callable[[ReplicaStatus], bool], timeout: float) -> ReplicaStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if predicate(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: condition not reached within {timeout} s; status {status}")
            time.sleep(0.01)

    def wait_until_at(self, epoch: int, seq: int, timeout: float = 10.0) -> ReplicaStatus:
        return self.wait_for(
            lambda s: s.phase == "live" and not s.disconnected and s.epoch == epoch and s.seq == seq, timeout
        )

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.events = self.context.socket(zmq.SUB)
            self.events.setsockopt(zmq.LINGER, 0)
            # Join, step 1: subscribe to the store's exact topic before anything else.
            self.events.setsockopt(zmq.SUBSCRIBE, wire.topic(self.store))
            for endpoint in self.events_endpoints:  # only the leader publishes
                self.events.connect(endpoint)
            self.commands: Optional[zmq.Socket] = None
            self._fresh_command_socket()
            with self.lock:
                self._reset(time.monotonic())
                self._request_snapshot(time.monotonic())
            self._ready.set()
            while not self._stop.is_set():
                now = time.monotonic()
                wait = max(0.0, min(self._next_deadline(now) - now, 0.05))
                poller = zmq.Poller()
                poller.register(self.events, zmq.POLLIN)
                poller.register(self.commands, zmq.POLLIN)
                ready = dict(poller.poll(int(wait * 1000) + 1))
                if self.events in ready:
                    self._read_events()
                if self.commands in ready:
                    self._read_replies()
                with self.lock:
                    self._tick(time.monotonic())
        except BaseException as error:  # surfaced by status()
            log.exception("replica thread failed")
            self._error = error
            self._ready.set()
        finally:
            for sock in (getattr(self, "events", None), getattr(self, "commands", None)):
                if sock is not None:
                    sock.close(linger=0)

    def _fresh_command_socket(self) -> None:
        """Lazy Pirate: a socket whose peer went silent may hold lost requests; start a fresh one, to the daemon
        the search points at now."""
        if self.commands is not None:
            self.commands.close(linger=0)
        self.commands = self.context.socket(zmq.DEALER)
        self.commands.setsockopt(zmq.LINGER, 0)
        self.commands.connect(self.search.endpoint)

    def _move_on(self, why: str, now: float) -> float:
        """Requests go to the next daemon (a timeout, or not_leader) on a fresh socket; returns how long to wait
        before sending there (LeaderSearch's pause)."""
        before = self.search.endpoint
        if why == "not_leader":
            pause = self.search.not_leader()
        else:
            self.search.timed_out()
            pause = 0.0
        self._fresh_command_socket()
        if self.search.endpoint != before:
            log.info("%s: sending to %s instead of %s (%s)", self.name, self.search.endpoint, before, why)
            self.moves.append((before, self.search.endpoint, why))
        return pause

    def _read_events(self) -> None:
        for _ in range(10_000):
            try:
                frames = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = wire.decode_event(frames)
            except wire.WireError as error:
                with self.lock:
                    self.problems.append(f"unreadable events message: {error}")
                continue
            if message.store != self.store:
                continue
            with self.lock:
                now = time.monotonic()
                self.disconnected = False
                if isinstance(message, wire.Event):
                    if self._drop_events > 0:
                        self._drop_events -= 1
                        self.dropped += 1
                        continue
                    self._on_event(message, now)
                elif isinstance(message, wire.Heartbeat):
                    self._on_heartbeat(message, now)
                elif isinstance(message, wire.Checkpoint):
                    self._on_checkpoint(message, now)
                else:
                    self._on_digest(message, now)

    def _read_replies(self) -> None:
        for _ in range(10_000):
            try:
                frames = self.commands.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            with self.lock:
                if not frames or frames[0] != b"":
                    self.problems.append("a reply without the empty delimiter frame")
                    continue
                try:
                    reply = wire.decode_reply(frames[1:])
                except wire.WireError as error:
                    self.problems.append(f"unreadable reply: {error}")
                    continue
                awaiting = self.awaiting
                if awaiting is None or reply.request_id != awaiting["request_id"]:
                    continue  # the answer to a request given up on
                now = time.monotonic()
                if (
                    isinstance(reply, wire.Error)
                    and reply.code == wire.NOT_LEADER
                    and len(self.search.endpoints) > 1
                ):
                    # A standby: nothing was applied; the request goes on at the next daemon that may lead. A
                    # standby's word says nothing of the store: the replica stays disconnected if it was.
                    self._retry_later(awaiting, now, self._move_on("not_leader", now), keep_clock=True)
                    continue
                self.search.answered()
                self.awaiting = None
                self.last_heard = now
                if isinstance(reply, wire.Snapshot) and awaiting["kind"] == "snapshot":
                    self._on_snapshot(reply, now)
                elif isinstance(reply, wire.Range) and awaiting["kind"] == "range":
                    self._on_range(reply, awaiting, now)
                elif isinstance(reply, wire.Compacted) and awaiting["kind"] == "range":
                    self._on_compacted(reply, now)
                elif isinstance(reply, wire.Error):
                    self._on_error(reply, awaiting, now)
                else:
                    self.problems.append(f"unexpected reply {type(reply).__name__} to {awaiting['kind']}")
                    self._retry_later(awaiting, now, 0.1)

    # -- the procedure (called with the lock held) ---------------------------------------------------

    def _reset(self, now: float) -> None:
        self.phase = "joining"
        self.epoch: Optional[int] = None
        self.last = 0
        self.state = self.domain.initial_state()
        self.kept: Dict[int, bytes] = {}
        self.kept_epoch: Optional[int] = None
        self.pending_digests: Dict[int, bytes] = {}
        # CHECKPOINTs: the state's digest kept at each seq the daemon digests off its loop, until its DIGEST comes.
        self.kept_digests: Dict[int, bytes] = {}
        self.pending_checkpoint: Optional[int] = None
        self.pending_digests_epoch: Optional[int] = None
        self.daemon_seq = 0
        self.daemon_seq_epoch: Optional[int] = None
        self.awaiting: Optional[dict] = None
        self.retry: Optional[tuple] = None  # (when, request description)
        self.last_heard = now
        self.log = {}

    def _new_request_id(self) -> int:
        request_id = self.next_request_id
        self.next_request_id += 1
        return request_id

    def _send(self, request: wire.Request) -> None:
        try:
            self.commands.send_multipart([b""] + wire.encode_request(request), zmq.NOBLOCK)
        except zmq.Again:
            pass  # counts as lost: the request timeout sends it again

    def _request_snapshot(self, now: float, clock: Optional[dict] = None) -> None:
        """SNAPSHOT; `clock` (the `sent` and `tries` of an earlier send) keeps that send's timeout running."""
        self.retry = None
        request = wire.SnapshotRequest(self._new_request_id(), self.store)
        self.awaiting = {"kind": "snapshot", "request_id": request.request_id, "sent": now, "tries": 0}
        self.awaiting.update(clock or {})
        self._send(request)

    def _request_range(
        self, from_seq: int, to_seq: int, now: float, probe: bool = False, clock: Optional[dict] = None
    ) -> None:
        """RANGE from_seq..to_seq: a repair, or (`probe`) after a silence, the events from the last held on, which
        leaves the phase as it is (events that come meanwhile apply as usual)."""
        self.retry = None
        if not probe:
            self.phase = "repairing"
            self.repairs += 1
        request = wire.RangeRequest(self._new_request_id(), self.store, from_seq, to_seq)
        self.awaiting = {"kind": "range", "request_id": request.request_id, "sent": now, "tries": 0,
                         "from": from_seq, "to": to_seq, "probe": probe}
        self.awaiting.update(clock or {})
        self._send(request)

    def _request_again(self, request: dict, now: float) -> None:
        """Sends a request of the kind described again (a new request id: SNAPSHOT and RANGE change nothing); a
        description with a `clock` keeps the timeout of its first send running."""
        clock = request.get("clock")
        if request["kind"] == "snapshot":
            self._request_snapshot(now, clock)
        else:
            self._request_range(request["from"], request["to"], now, probe=request.get("probe", False), clock=clock)

    def _retry_later(self, awaiting: dict, now: float, delay: float, keep_clock: bool = False) -> None:
        """Sends `awaiting` again after `delay`; with `keep_clock` (after a standby's not_leader) its timeout still
        counts from its first send, so standbys that only say not_leader do not keep it out for ever."""
        self.awaiting = None
        again = dict(awaiting)
        if keep_clock:
            again["clock"] = {"sent": awaiting["sent"], "tries": awaiting.get("tries", 0)}
        self.retry = (now + delay, again)

    def _resync(self, reason: str, now: float, keep: Optional[wire.Event] = None, delay: float = 0.0) -> None:
        log.warning("%s: resync: %s", self.name, reason)
        self.resync_reasons.append(reason)
        self._reset(now)
        if keep is not None:
            self._keep(keep.epoch, keep.seq, keep.action)
        if delay > 0:
            self.retry = (now + delay, {"kind": "snapshot"})
        else:
            self._request_snapshot(now)

    def _diverged(self, seq: int, detail: str, now: float) -> None:
        log.error("%s: DIVERGED from the daemon at seq %d: %s", self.name, seq, detail)
        self.divergences.append((seq, detail))
        if self._last_divergence is not None and now - self._last_divergence <= 10.0:
            self._divergence_streak += 1
        else:
            self._divergence_streak = 1
        self._last_divergence = now
        delay = 0.0 if self._divergence_streak == 1 else min(0.1 * 2 ** (self._divergence_streak - 2), 5.0)
        self._resync(f"divergence at seq {seq}: {detail}", now, delay=delay)

    def _heard(self, epoch: int, seq: int) -> None:
        if self.daemon_seq_epoch != epoch:
            self.daemon_seq_epoch = epoch
            self.daemon_seq = seq
        else:
            self.daemon_seq = max(self.daemon_seq, seq)

    def _keep(self, epoch: int, seq: int, action: bytes) -> None:
        if self.kept_epoch != epoch:
            self.kept = {}
            self.kept_epoch = epoch
        self.kept[seq] = action

    def _apply(self, seq: int, raw: bytes, now: float) -> bool:
        """Applies the action with seq = last + 1; False if it could not (a divergence was reported)."""
        assert seq == self.last + 1
        try:
            action = self.domain.decode_action(raw)
        except Undecodable as error:
            self._diverged(seq, f"the action is not an action of {self.store}: {error}", now)
            return False
        self.domain.reduce(self.state, action)  # replicas reduce without validating
        self.last = seq
        if self.keep_log:
            self.log[seq] = bytes(raw)
        return self._check_pending_digest(now)

    def _verify(self, seq: int, daemon_digest: bytes, now: float) -> bool:
        mine = self.domain.digest(self.state)
        if mine != daemon_digest:
            self._diverged(seq, f"the daemon's digest is {daemon_digest.hex()}, this replica's is {mine.hex()}", now)
            return False
        return True

    def _check_pending_digest(self, now: float) -> bool:
        if self.pending_checkpoint is not None and self.pending_checkpoint <= self.last:
            if self.pending_checkpoint == self.last:
                self._keep_digest()
            self.pending_checkpoint = None
        if self.pending_digests_epoch != self.epoch:
            self.pending_digests = {}
            return True
        for seq in [s for s in self.pending_digests if s < self.last]:
            del self.pending_digests[seq]
        expected = self.pending_digests.pop(self.last, None)
        if expected is not None:
            return self._verify(self.last, expected, now)
        return True

    def _drain(self, now: float) -> None:
        """Join step 5 (and after a repair): apply kept events in order; a gap -> RANGE; else live."""
        for seq in [s for s in self.kept if s <= self.last]:
            del self.kept[seq]
        while self.last + 1 in self.kept:
            if not self._apply(self.last + 1, self.kept.pop(self.last + 1), now):
                return
        if not self._check_pending_digest(now):
            return
        if self.kept:
            self._request_range(self.last + 1, min(self.kept) - 1, now)
            return
        self.phase = "live"
        self._repair_if_behind(now)

    def _repair_if_behind(self, now: float) -> None:
        if (
            self.phase == "live"
            and self.awaiting is None
            and self.retry is None
            and self.daemon_seq_epoch == self.epoch
            and self.daemon_seq > self.last
        ):
            self._request_range(self.last + 1, self.daemon_seq, now)

    def _other_epoch(self, epoch: int) -> bool:
        return self.epoch is not None and epoch != self.epoch

    def _on_event(self, event: wire.Event, now: float) -> None:
        self.last_heard = now
        if self._other_epoch(event.epoch):
            self._resync(f"new epoch {event.epoch:016x} (was {self.epoch:016x}) in an EVENT", now, keep=event)
            return
        self._heard(event.epoch, event.seq)
        if self.phase == "joining":
            self._keep(event.epoch, event.seq, event.action)
        elif self.phase == "repairing":
            if event.seq > self.last:
                self._keep(event.epoch, event.seq, event.action)
        elif event.seq <= self.last:
            pass  # a duplicate
        elif event.seq == self.last + 1:
            self._apply(event.seq, event.action, now)
        else:
            self._keep(event.epoch, event.seq, event.action)
            self._request_range(self.last + 1, event.seq - 1, now)

    def _on_heartbeat(self, beat: wire.Heartbeat, now: float) -> None:
        self.last_heard = now
        if self._other_epoch(beat.epoch):
            self._resync(f"new epoch {beat.epoch:016x} (was {self.epoch:016x}) in a HEARTBEAT", now)
            return
        self._heard(beat.epoch, beat.last_seq)
        self._repair_if_behind(now)

    def _keep_digest(self) -> None:
        self.kept_digests[self.last] = self.domain.digest(self.state)
        for seq in sorted(self.kept_digests)[:-4]:
            del self.kept_digests[seq]

    def _on_checkpoint(self, message: wire.Checkpoint, now: float) -> None:
        self.last_heard = now
        if self._other_epoch(message.epoch):
            self._resync(f"new epoch {message.epoch:016x} (was {self.epoch:016x}) in a CHECKPOINT", now)
            return
        self._heard(message.epoch, message.seq)
        if self.epoch is None or self.phase == "joining" or message.seq < self.last:
            return
        if message.seq == self.last:
            self._keep_digest()
        else:
            self.pending_checkpoint = message.seq
            self._repair_if_behind(now)

    def _on_digest(self, message: wire.Digest, now: float) -> None:
        self.last_heard = now
        if self._other_epoch(message.epoch):
            self._resync(f"new epoch {message.epoch:016x} (was {self.epoch:016x}) in a DIGEST", now)
            return
        self._heard(message.epoch, message.seq)
        if self.epoch is not None and message.seq == self.last and self.phase != "joining":
            self._verify(message.seq, message.digest, now)
            return
        if self.epoch is not None and message.seq < self.last and self.phase != "joining":
            # A DIGEST taken off the daemon's loop, after later events: compare it with the digest kept at its seq.
            mine = self.kept_digests.pop(message.seq, None)
            for seq in [s for s in self.kept_digests if s < message.seq]:
                del self.kept_digests[seq]
            if mine is not None and mine != message.digest:
                self._diverged(message.seq, f"the daemon's digest is {message.digest.hex()}, this replica's "
                               f"was {mine.hex()}", now)
            return
        if message.seq > self.last or self.phase == "joining":
            if self.pending_digests_epoch != message.epoch:
                self.pending_digests = {}
                self.pending_digests_epoch = message.epoch
            self.pending_digests[message.seq] = message.digest
            self._repair_if_behind(now)

    def _on_snapshot(self, snap: wire.Snapshot, now: float) -> None:
        if snap.store != self.store:
            self.problems.append(f"a SNAPSHOT of store {snap.store}")
            self._request_snapshot(now)
            return
        # Join step 3: check the digest against frame 2; ask again if they differ.
        if not snap.digest_matches():
            self.problems.append(f"a SNAPSHOT whose digest does not match its state (seq {snap.seq})")
            self._request_snapshot(now)
            return
        if self._other_epoch(snap.epoch):
            self._resync(f"new epoch {snap.epoch:016x} (was {self.epoch:016x}) in a SNAPSHOT", now)
            return
        try:
            state = self.domain.decode_state(snap.state)
        except Undecodable as error:
            self._diverged(snap.seq, f"the snapshot is not a state of {self.store}: {error}", now)
            return
        if self.domain.encode(state) != snap.state:
            self.problems.append(f"the SNAPSHOT's state at seq {snap.seq} is not in canonical form as encoded here")
        # Step 4: install; drop kept events of another epoch and those <= seq.
        self.snapshots += 1
        self.state = state
        self.epoch = snap.epoch
        self.last = snap.seq
        self.log = {}
        if self.kept_epoch != snap.epoch:
            self.kept = {}
            self.kept_epoch = snap.epoch
        self._heard(snap.epoch, snap.seq)
        self._drain(now)

    def _on_range(self, reply: wire.Range, awaiting: dict, now: float) -> None:
        if reply.store != self.store or reply.first_seq != awaiting["from"]:
            self.problems.append(f"a RANGE reply for {reply.store} from {reply.first_seq}, asked {awaiting}")
        if self._other_epoch(reply.epoch):
            self._resync(f"new epoch {reply.epoch:016x} (was {self.epoch:016x}) in a RANGE reply", now)
            return
        before = self.last
        for offset, action in enumerate(reply.actions):
            seq = reply.first_seq + offset
            if seq <= self.last:
                continue
            if seq != self.last + 1:
                break  # a hole: ask again below
            if not self._apply(seq, action, now):
                return
        self._heard(reply.epoch, self.last)
        if awaiting.get("probe"):
            # A silence's probe asked for everything from the last event held on: what came is applied; the rest
            # comes as gaps, or with the next silence's probe.
            self._drain(now)
            return
        if self.last < awaiting["to"]:
            if self.last == before:
                # k = 0 (or nothing usable): "nothing to send now"; ask again a little later.
                self._retry_later(awaiting, now, 0.1)
                self.retry[1]["from"] = self.last + 1
                return
            # The reply ended short: ask again from the next seq.
            self._request_range(self.last + 1, awaiting["to"], now)
            return
        self._drain(now)

    def _on_compacted(self, reply: wire.Compacted, now: float) -> None:
        if self._other_epoch(reply.epoch):
            self._resync(f"new epoch {reply.epoch:016x} (was {self.epoch:016x}) in a COMPACTED reply", now)
            return
        # Take a SNAPSHOT instead, keeping the kept events; continue from join step 3.
        self.compacted += 1
        self.phase = "repairing"
        self._request_snapshot(now)

    def _on_error(self, error: wire.Error, awaiting: dict, now: float) -> None:
        self.errors.append(f"ERROR {error.name} to {awaiting['kind']}: {error.reason}")
        if error.code == wire.INVALID_RANGE and awaiting["kind"] == "range":
            # The daemon is behind what this replica was told: its history is not the one we hold.
            self._resync(f"invalid_range for a repair: {error.reason}", now)
            return
        # unavailable (busy, journal failing), unknown_store, internal: ask again later.
        self._retry_later(awaiting, now, 0.25)

    def _next_deadline(self, now: float) -> float:
        deadline = now + 0.05
        if self.retry is not None:
            deadline = min(deadline, self.retry[0])
        return deadline

    def _tick(self, now: float) -> None:
        if self.retry is not None:
            when, request = self.retry
            if now < when:
                return
            self.retry = None
            self._request_again(request, now)
            return
        # Silence: nothing from the store for 3 heartbeat intervals. The daemon is down, paused, or a failover is
        # under way: keep the state, and ask for the events from the last held on unless a request is out already.
        # The answer's epoch (or invalid_range) tells whether the history that answers still holds it.
        silence = now - self.last_heard
        if self.epoch is not None and silence > self.silence_limit:
            self.last_heard = now
            self.silences += 1
            if not self.disconnected:
                log.warning("%s: nothing heard for %.2f s; keeping the state at seq %d and asking after it",
                            self.name, silence, self.last)
            self.disconnected = True
            if self.awaiting is None:
                self.probes += 1
                if self.last > 0:
                    self._request_range(self.last, wire.MAX_SEQ, now, probe=True)
                else:
                    self._request_snapshot(now)
            return
        # A SNAPSHOT or RANGE unanswered within the timeout is sent again on a fresh socket, to the next daemon
        # when there are several; each repeat in a row waits twice as long, up to 8 timeouts, so a slow reply gets
        # through.
        tries = self.awaiting.get("tries", 0) if self.awaiting is not None else 0
        if self.awaiting is not None and now - self.awaiting["sent"] > self.request_timeout * 2 ** min(tries, 3):
            awaiting = dict(self.awaiting)
            self._move_on("no answer in time", now)
            awaiting["clock"] = {"sent": now, "tries": tries + 1}
            self._request_again(awaiting, now)
