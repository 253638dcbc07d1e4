"""The Lockstep wire protocol, version 1, in Python: written from docs/protocol.md.

Every message of the protocol can be encoded and decoded here (requests, replies, events), with the
checks the spec asks of a receiver, in the order it gives ("Error codes"); the canonical JSON form of a
value (docs/protocol.md "Field formats", canonical JSON as Swift's JSONEncoder with
[.sortedKeys, .withoutEscapingSlashes] writes it) and the SHA-256 digest of a state.

Nothing here talks to a socket: see client.py for the dispatcher and the replica.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Dict, List, Optional, Sequence, Union

MAGIC = b"LS"
VERSION = 1

# Message types (docs/protocol.md "Common header").
DISPATCH = 0x01
SNAPSHOT_REQUEST = 0x02
RANGE_REQUEST = 0x03
STATUS_REQUEST = 0x04
EFFECTS_REQUEST = 0x05
REPORT = 0x06  # a replica's progress (applied seq, counts); the daemon never answers it
ACCEPTED = 0x81
REJECTED = 0x82
SNAPSHOT_REPLY = 0x83
RANGE_REPLY = 0x84
COMPACTED = 0x85
STATUS_REPLY = 0x86
EFFECTS_REPLY = 0x87
ERROR = 0x8F
EVENT = 0x41
HEARTBEAT = 0x42
DIGEST = 0x43
EVENTS = 0x44
EVENT_BY = 0x45  # an EVENT with its author (docs/security.md): topic, header, action, author
EVENTS_BY = 0x46  # an EVENTS with each action's author: topic, header, actions…, authors…
CHECKPOINT = 0x47  # the daemon digests `seq` off its loop: a DIGEST of it follows later (docs/protocol.md)
TRACE = 0x48  # the trace context of the daemon's span of seqs first..last, on the trace topic (name + 0x02)
RANGE_REPLY_BY = 0x88  # a RANGE reply with each action's author: header, store, actions…, authors…

REQUEST_TYPES = {DISPATCH, SNAPSHOT_REQUEST, RANGE_REQUEST, STATUS_REQUEST, EFFECTS_REQUEST, REPORT}
REPLY_TYPES = {
    ACCEPTED, REJECTED, SNAPSHOT_REPLY, RANGE_REPLY, COMPACTED, STATUS_REPLY, EFFECTS_REPLY, RANGE_REPLY_BY, ERROR,
}
EVENT_TYPES = {EVENT, HEARTBEAT, DIGEST, EVENTS, EVENT_BY, EVENTS_BY, CHECKPOINT, TRACE}

# The exact header frame length of each type.
HEADER_SIZE = {
    DISPATCH: 32,
    SNAPSHOT_REQUEST: 12,
    RANGE_REQUEST: 28,
    STATUS_REQUEST: 12,
    REPORT: 72,
    EFFECTS_REQUEST: 12,
    ACCEPTED: 32,
    REJECTED: 16,
    SNAPSHOT_REPLY: 60,
    RANGE_REPLY: 28,
    COMPACTED: 28,
    STATUS_REPLY: 12,
    EFFECTS_REPLY: 12,
    ERROR: 14,
    EVENT: 20,
    HEARTBEAT: 20,
    EVENTS: 20,
    DIGEST: 52,
    EVENT_BY: 20,
    EVENTS_BY: 20,
    CHECKPOINT: 20,
    TRACE: 28,
    RANGE_REPLY_BY: 28,
}

# Error codes (docs/protocol.md "Error codes").
MALFORMED = 1
UNSUPPORTED_VERSION = 2
UNKNOWN_MESSAGE_TYPE = 3
TOO_LARGE = 4
UNKNOWN_STORE = 5
DOMAIN_VERSION_MISMATCH = 6
UNDECODABLE_ACTION = 7
IDEMPOTENCY_CONFLICT = 8
INVALID_RANGE = 9
UNAVAILABLE = 10
INTERNAL = 11
NOT_LEADER = 12
UNKNOWN_EFFECT = 13
FORBIDDEN = 14  # the daemon's policy grants the sender no right to this (docs/security.md); nothing was done

ERROR_NAMES = {
    MALFORMED: "malformed",
    UNSUPPORTED_VERSION: "unsupported_version",
    UNKNOWN_MESSAGE_TYPE: "unknown_message_type",
    TOO_LARGE: "too_large",
    UNKNOWN_STORE: "unknown_store",
    DOMAIN_VERSION_MISMATCH: "domain_version_mismatch",
    UNDECODABLE_ACTION: "undecodable_action",
    IDEMPOTENCY_CONFLICT: "idempotency_conflict",
    INVALID_RANGE: "invalid_range",
    UNAVAILABLE: "unavailable",
    INTERNAL: "internal",
    NOT_LEADER: "not_leader",
    UNKNOWN_EFFECT: "unknown_effect",
    FORBIDDEN: "forbidden",
}

# Limits (docs/protocol.md "Limits"), the defaults.
MAXIMUM_BATCH = 1000
MAXIMUM_ACTION_BYTES = 1 << 20
MAXIMUM_REASON_BYTES = 4096
MAXIMUM_STORE_NAME_BYTES = 64
MAXIMUM_REJECTION_CODE_BYTES = 64
CLIENT_ID_BYTES = 16
MAXIMUM_EFFECT_ID_BYTES = 200
MAXIMUM_REPLICA_NAME_BYTES = 200
MAXIMUM_TRACE_CONTEXT_BYTES = 1024
EFFECTS_COMMANDS = ("list", "retry", "drop")
MAX_SEQ = 2**64 - 1  # the largest seq a RANGE may ask for (a daemon stops at its own last)
DIGEST_BYTES = 32
U64_MAX = (1 << 64) - 1

_STORE_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_REJECTION_CODE_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class WireError(Exception):
    """A message this peer cannot read, with the ERROR code the spec names for it."""

    def __init__(self, code: int, reason: str):
        super().__init__(f"{reason} [{error_name(code)}]")
        self.code = code
        self.reason = reason


def error_name(code: int) -> str:
    """The spec's name of an error code; unknown codes are to be treated as `internal`."""
    return ERROR_NAMES.get(code, f"error_{code}")


@dataclass(frozen=True)
class Limits:
    maximum_batch: int = MAXIMUM_BATCH
    maximum_action_bytes: int = MAXIMUM_ACTION_BYTES


DEFAULT_LIMITS = Limits()


# --------------------------------------------------------------------------------------------------
# Field checks


def check_store_name(name: bytes, field_name: str = "store name") -> str:
    if not 1 <= len(name) <= MAXIMUM_STORE_NAME_BYTES:
        raise WireError(MALFORMED, f"{field_name} is {len(name)} bytes; expected 1 to 64")
    for index, byte in enumerate(name):
        if byte not in _STORE_NAME_BYTES:
            raise WireError(MALFORMED, f"{field_name} has byte 0x{byte:02x} at offset {index}")
    return name.decode("ascii")


def store_bytes(store: Union[str, bytes]) -> bytes:
    raw = store.encode("ascii") if isinstance(store, str) else bytes(store)
    check_store_name(raw)
    return raw


def topic(store: Union[str, bytes]) -> bytes:
    """The topic of a store's one-by-one stream (an EVENT per action): its name and one 0x00 byte."""
    return store_bytes(store) + b"\x00"


def run_topic(store: Union[str, bytes]) -> bytes:
    """The topic of a store's stream in runs (an EVENTS per commit): its name and one 0x01 byte."""
    return store_bytes(store) + b"\x01"


def check_action(action: bytes, field_name: str, limits: Limits) -> bytes:
    if len(action) == 0:
        raise WireError(MALFORMED, f"{field_name} is empty")
    if len(action) > limits.maximum_action_bytes:
        raise WireError(TOO_LARGE, f"{field_name} is {len(action)} bytes; over {limits.maximum_action_bytes}")
    return bytes(action)


_AUTHOR_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def check_author(author: bytes, field_name: str) -> str:
    """An author: empty, or up to 64 bytes of ASCII letters, digits, '-' and '_' (docs/protocol.md)."""
    if len(author) > 64 or any(b not in _AUTHOR_BYTES for b in author):
        raise WireError(MALFORMED, f"{field_name} is not an author (at most 64 letters, digits, '-' or '_')")
    return author.decode()


def check_reason(reason: bytes, field_name: str) -> str:
    if len(reason) > MAXIMUM_REASON_BYTES:
        raise WireError(TOO_LARGE, f"{field_name} is {len(reason)} bytes; over {MAXIMUM_REASON_BYTES}")
    try:
        return bytes(reason).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(MALFORMED, f"{field_name} is not UTF-8") from None


def check_rejection_code(code: bytes) -> str:
    if not 1 <= len(code) <= MAXIMUM_REJECTION_CODE_BYTES:
        raise WireError(MALFORMED, f"rejection code is {len(code)} bytes; expected 1 to 64")
    for index, byte in enumerate(code):
        if byte not in _REJECTION_CODE_BYTES:
            raise WireError(MALFORMED, f"rejection code has byte 0x{byte:02x} at offset {index}")
    return code.decode("ascii")


def sanitize_rejection_code(code: str) -> bytes:
    """What a sender of REJECTED does with a careless code: other bytes become `_`, cut at 64 bytes."""
    raw = code.encode("utf-8")[:MAXIMUM_REJECTION_CODE_BYTES]
    out = bytes(b if b in _REJECTION_CODE_BYTES else 0x5F for b in raw)
    return out or b"invalid_action"


def cut_reason(text: str) -> bytes:
    """A reason as UTF-8, cut at a character boundary to 4096 bytes."""
    raw = text.encode("utf-8")
    if len(raw) <= MAXIMUM_REASON_BYTES:
        return raw
    end = MAXIMUM_REASON_BYTES
    while end > 0 and raw[end] & 0xC0 == 0x80:
        end -= 1
    return raw[:end]


def _header(kind: int) -> bytes:
    return MAGIC + bytes([VERSION, kind])


def _u64(value: int) -> bytes:
    if not 0 <= value <= U64_MAX:
        raise ValueError(f"{value} is not a u64")
    return struct.pack(">Q", value)


def _client_id(client_id: bytes) -> bytes:
    if len(client_id) != CLIENT_ID_BYTES:
        raise ValueError("a client id is 16 bytes")
    return bytes(client_id)


# --------------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Dispatch:
    request_id: int
    domain_version: int
    client_id: bytes
    store: str
    actions: List[bytes]
    # The client span's trace context (W3C: traceparent, tracestate), after the header's 32 bytes; None for none.
    trace: Optional[Dict[str, str]] = None


@dataclass(frozen=True)
class SnapshotRequest:
    request_id: int
    store: str


@dataclass(frozen=True)
class RangeRequest:
    request_id: int
    store: str
    from_seq: int
    to_seq: int


@dataclass(frozen=True)
class StatusRequest:
    request_id: int


@dataclass(frozen=True)
class EffectsRequest:
    request_id: int
    command: str  # list, retry or drop
    effect_id: Optional[str] = None  # store/seq/index, for retry and drop


@dataclass(frozen=True)
class Report:
    """A replica's progress (docs/protocol.md "REPORT"): sent now and then, never answered."""
    request_id: int
    client_id: bytes
    store: str
    name: str
    epoch: int  # 0 before the replica has a state
    applied_seq: int
    interval_ms: int
    repairs: int = 0
    resyncs: int = 0
    divergences: int = 0


@dataclass(frozen=True)
class Accepted:
    request_id: int
    epoch: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


@dataclass(frozen=True)
class Rejected:
    request_id: int
    index: int
    code: str
    reason: str


@dataclass(frozen=True)
class Snapshot:
    request_id: int
    store: str
    epoch: int
    seq: int
    digest: bytes
    state: bytes

    def digest_matches(self) -> bool:
        """The receiver must check this before using the state (docs/protocol.md "SNAPSHOT (0x83)")."""
        return hashlib.sha256(self.state).digest() == self.digest


@dataclass(frozen=True)
class Range:
    request_id: int
    store: str
    epoch: int
    first_seq: int
    actions: List[bytes]
    authors: List[str] = field(default_factory=list)  # empty: nobody identified (a RANGE, not a RANGE_BY)


@dataclass(frozen=True)
class Compacted:
    request_id: int
    store: str
    epoch: int
    first_available: int


@dataclass(frozen=True)
class Status:
    request_id: int
    json_bytes: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.json_bytes.decode("utf-8"))


@dataclass(frozen=True)
class Effects:
    request_id: int
    json_bytes: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.json_bytes.decode("utf-8"))


@dataclass(frozen=True)
class Error:
    request_id: int
    code: int
    reason: str

    @property
    def name(self) -> str:
        return error_name(self.code)


@dataclass(frozen=True)
class Event:
    store: str
    epoch: int
    seq: int
    action: bytes
    author: str = ""  # who dispatched it, under the daemon's policy; "" for nobody identified (an EVENT)


@dataclass(frozen=True)
class Events:
    store: str
    epoch: int
    first_seq: int
    actions: List[bytes]
    authors: List[str] = field(default_factory=list)  # empty: nobody identified (an EVENTS, not an EVENTS_BY)


@dataclass(frozen=True)
class Heartbeat:
    store: str
    epoch: int
    last_seq: int


@dataclass(frozen=True)
class Digest:
    store: str
    epoch: int
    seq: int
    digest: bytes


@dataclass(frozen=True)
class Checkpoint:
    store: str
    epoch: int
    seq: int


@dataclass(frozen=True)
class Trace:
    store: str
    epoch: int
    first_seq: int
    last_seq: int
    context: Dict[str, str]


Request = Union[Dispatch, SnapshotRequest, RangeRequest, StatusRequest, EffectsRequest, Report]
Reply = Union[Accepted, Rejected, Snapshot, Range, Compacted, Status, Effects, Error]
Published = Union[Event, Events, Heartbeat, Digest, Checkpoint, Trace]


# --------------------------------------------------------------------------------------------------
# Encoding


def encode_request(request: Request) -> List[bytes]:
    """The body of a request (for REQ; a DEALER puts an empty frame before it)."""
    if isinstance(request, Dispatch):
        if not 1 <= len(request.actions):
            raise ValueError("a DISPATCH carries at least one action")
        head = _header(DISPATCH) + _u64(request.request_id) + struct.pack(">I", request.domain_version)
        head += _client_id(request.client_id)
        if request.trace:
            head += "\n".join(f"{k}={v}" for k, v in sorted(request.trace.items())).encode("utf-8")
        return [head, store_bytes(request.store)] + [bytes(a) for a in request.actions]
    if isinstance(request, SnapshotRequest):
        return [_header(SNAPSHOT_REQUEST) + _u64(request.request_id), store_bytes(request.store)]
    if isinstance(request, RangeRequest):
        head = _header(RANGE_REQUEST) + _u64(request.request_id) + _u64(request.from_seq) + _u64(request.to_seq)
        return [head, store_bytes(request.store)]
    if isinstance(request, StatusRequest):
        return [_header(STATUS_REQUEST) + _u64(request.request_id)]
    if isinstance(request, EffectsRequest):
        body = [_header(EFFECTS_REQUEST) + _u64(request.request_id), request.command.encode("utf-8")]
        return body + ([request.effect_id.encode("utf-8")] if request.effect_id is not None else [])
    if isinstance(request, Report):
        head = (_header(REPORT) + _u64(request.request_id) + _client_id(request.client_id) + _u64(request.epoch)
                + _u64(request.applied_seq) + struct.pack(">I", request.interval_ms) + _u64(request.repairs)
                + _u64(request.resyncs) + _u64(request.divergences))
        return [head, store_bytes(request.store), request.name.encode("utf-8")]
    raise TypeError(f"not a request: {request!r}")


def encode_reply(reply: Reply) -> List[bytes]:
    """The body of a reply, as the daemon writes it (used by the tests' golden vectors)."""
    if isinstance(reply, Accepted):
        head = _header(ACCEPTED) + _u64(reply.request_id) + _u64(reply.epoch) + _u64(reply.first_seq)
        return [head + struct.pack(">I", reply.count)]
    if isinstance(reply, Rejected):
        head = _header(REJECTED) + _u64(reply.request_id) + struct.pack(">I", reply.index)
        return [head, sanitize_rejection_code(reply.code), cut_reason(reply.reason)]
    if isinstance(reply, Snapshot):
        head = _header(SNAPSHOT_REPLY) + _u64(reply.request_id) + _u64(reply.epoch) + _u64(reply.seq)
        return [head + reply.digest, store_bytes(reply.store), reply.state]
    if isinstance(reply, Range):
        authored = any(reply.authors)
        head = _header(RANGE_REPLY_BY if authored else RANGE_REPLY) + _u64(reply.request_id) + _u64(reply.epoch)
        frames = [head + _u64(reply.first_seq), store_bytes(reply.store)] + list(reply.actions)
        return frames + [a.encode() for a in reply.authors] if authored else frames
    if isinstance(reply, Compacted):
        head = _header(COMPACTED) + _u64(reply.request_id) + _u64(reply.epoch) + _u64(reply.first_available)
        return [head, store_bytes(reply.store)]
    if isinstance(reply, Status):
        return [_header(STATUS_REPLY) + _u64(reply.request_id), reply.json_bytes]
    if isinstance(reply, Effects):
        return [_header(EFFECTS_REPLY) + _u64(reply.request_id), reply.json_bytes]
    if isinstance(reply, Error):
        head = _header(ERROR) + _u64(reply.request_id) + struct.pack(">H", reply.code)
        return [head, cut_reason(reply.reason)]
    raise TypeError(f"not a reply: {reply!r}")


def encode_event(message: Published) -> List[bytes]:
    """An events-socket message: [topic, header(, action)]."""
    if isinstance(message, Event):
        kind = EVENT_BY if message.author else EVENT
        frames = [topic(message.store), _header(kind) + _u64(message.epoch) + _u64(message.seq), message.action]
        return frames + [message.author.encode()] if message.author else frames
    if isinstance(message, Heartbeat):
        return [topic(message.store), _header(HEARTBEAT) + _u64(message.epoch) + _u64(message.last_seq)]
    if isinstance(message, Digest):
        head = _header(DIGEST) + _u64(message.epoch) + _u64(message.seq) + message.digest
        return [topic(message.store), head]
    if isinstance(message, Checkpoint):
        return [topic(message.store), _header(CHECKPOINT) + _u64(message.epoch) + _u64(message.seq)]
    raise TypeError(f"not an event: {message!r}")


# --------------------------------------------------------------------------------------------------
# Decoding, with the checks of docs/protocol.md "Error codes", in its order


_NAMES = {
    DISPATCH: "DISPATCH request",
    SNAPSHOT_REQUEST: "SNAPSHOT request",
    RANGE_REQUEST: "RANGE request",
    STATUS_REQUEST: "STATUS request",
    EFFECTS_REQUEST: "EFFECTS request",
    REPORT: "REPORT request",
    ACCEPTED: "ACCEPTED",
    REJECTED: "REJECTED",
    SNAPSHOT_REPLY: "SNAPSHOT reply",
    RANGE_REPLY: "RANGE reply",
    COMPACTED: "COMPACTED",
    STATUS_REPLY: "STATUS reply",
    EFFECTS_REPLY: "EFFECTS reply",
    ERROR: "ERROR",
    EVENT: "EVENT",
    HEARTBEAT: "HEARTBEAT",
    DIGEST: "DIGEST",
    EVENTS: "EVENTS",
    EVENT_BY: "EVENT_BY",
    EVENTS_BY: "EVENTS_BY",
    CHECKPOINT: "CHECKPOINT",
    TRACE: "TRACE",
    RANGE_REPLY_BY: "RANGE_BY reply",
}


def _common(frame: bytes, index: int, allowed: set, family: str) -> int:
    """Steps 2-4: length >= 4 and magic, version, type of this direction."""
    if len(frame) < 4 or frame[0:2] != MAGIC:
        raise WireError(MALFORMED, f"header (frame {index}) has no magic 0x4c 0x53")
    if frame[2] != VERSION:
        raise WireError(
            UNSUPPORTED_VERSION,
            f"protocol version {frame[2]} is not spoken here; this peer speaks version {VERSION}",
        )
    if frame[3] not in allowed:
        raise WireError(UNKNOWN_MESSAGE_TYPE, f"message type 0x{frame[3]:02x} is not {family}")
    return frame[3]


def _exact_header(frame: bytes, kind: int, index: int) -> None:
    if len(frame) != HEADER_SIZE[kind]:
        raise WireError(
            MALFORMED,
            f"header (frame {index}) of {_NAMES[kind]} is {len(frame)} bytes; expected exactly {HEADER_SIZE[kind]}",
        )


def _frames(frames: Sequence[bytes], count: int, kind: int) -> None:
    if len(frames) != count:
        raise WireError(MALFORMED, f"{_NAMES[kind]} has {len(frames)} frames; expected exactly {count}")


def _positive(value: int, what: str, kind: int) -> None:
    if value < 1:
        raise WireError(MALFORMED, f"{what} of {_NAMES[kind]} is 0; expected 1 or more")


def _seq_run(first: int, count: int, kind: int) -> None:
    if count > 0 and first + count - 1 > U64_MAX:
        raise WireError(MALFORMED, f"first seq {first} of {_NAMES[kind]} with {count} actions passes 2^64-1")


def request_id_of(body: Sequence[bytes]) -> int:
    """The request id the daemon echoes in an ERROR: bytes 4..11 of frame 0 when it has >= 12 bytes and
    the magic, whatever its version and type; else 0."""
    if body and len(body[0]) >= 12 and body[0][0:2] == MAGIC:
        return struct.unpack(">Q", body[0][4:12])[0]
    return 0


def _text(raw: bytes, field_name: str, maximum: int) -> str:
    """1 to `maximum` bytes of UTF-8, or MALFORMED naming the field and its size."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or not 1 <= len(raw) <= maximum:
        raise WireError(MALFORMED, f"{field_name} is {len(raw)} bytes; expected 1 to {maximum} bytes of UTF-8")
    return text


def _trace_context(raw: bytes) -> Dict[str, str]:
    """A DISPATCH's trace context: key=value lines joined by \\n, 1 to 1024 bytes of UTF-8."""
    text = _text(raw, "trace context of DISPATCH request or TRACE", MAXIMUM_TRACE_CONTEXT_BYTES)
    fields = {}
    for line in text.split("\n"):
        key, equals, value = line.partition("=")
        if not equals or not key:
            raise WireError(MALFORMED, f"trace context of DISPATCH request has the line '{line[:64]}'; "
                                       f"expected key=value")
        fields[key] = value
    return fields


def decode_request(body: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> Request:
    """Reads a request body as the daemon must, raising WireError with the spec's code."""
    if len(body) < 1:
        raise WireError(MALFORMED, "request has no header frame")
    head = bytes(body[0])
    kind = _common(head, 0, REQUEST_TYPES, "a request")
    if len(head) < 12:
        raise WireError(MALFORMED, f"header (frame 0) is {len(head)} bytes; the request id needs 12")
    request_id = struct.unpack(">Q", head[4:12])[0]
    if len(body) > limits.maximum_batch + 2:
        raise WireError(TOO_LARGE, f"{_NAMES[kind]} has {len(body)} frames; at most {limits.maximum_batch + 2}")
    trace = None
    if kind == DISPATCH and len(head) > HEADER_SIZE[DISPATCH]:
        trace = _trace_context(head[HEADER_SIZE[DISPATCH]:])
        head = head[:HEADER_SIZE[DISPATCH]]
    _exact_header(head, kind, 0)
    if kind == DISPATCH:
        domain_version = struct.unpack(">I", head[12:16])[0]
        client_id = head[16:32]
        if len(body) < 3:
            raise WireError(MALFORMED, f"DISPATCH request has {len(body)} frames; expected 3 or more")
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        actions = [check_action(bytes(a), f"action {i}", limits) for i, a in enumerate(body[2:])]
        return Dispatch(request_id, domain_version, client_id, store, actions, trace)
    if kind == SNAPSHOT_REQUEST:
        _frames(body, 2, kind)
        return SnapshotRequest(request_id, check_store_name(bytes(body[1]), "store name (frame 1)"))
    if kind == RANGE_REQUEST:
        from_seq, to_seq = struct.unpack(">QQ", head[12:28])
        _frames(body, 2, kind)
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        if from_seq == 0 or from_seq > to_seq:
            raise WireError(INVALID_RANGE, f"RANGE request from {from_seq} to {to_seq}")
        return RangeRequest(request_id, store, from_seq, to_seq)
    if kind == EFFECTS_REQUEST:
        if len(body) < 2:
            raise WireError(MALFORMED, f"EFFECTS request has {len(body)} frames; expected 2 or 3")
        command = bytes(body[1]).decode("utf-8", errors="replace")
        if command not in EFFECTS_COMMANDS:
            raise WireError(MALFORMED, f"command (frame 1) of EFFECTS request is '{command[:64]}'; "
                                       f"expected list, retry or drop")
        if command == "list":
            _frames(body, 2, kind)
            return EffectsRequest(request_id, command)
        _frames(body, 3, kind)
        effect_id = _text(bytes(body[2]), "effect id (frame 2) of EFFECTS request", MAXIMUM_EFFECT_ID_BYTES)
        return EffectsRequest(request_id, command, effect_id)
    if kind == REPORT:
        client_id = head[12:28]
        epoch, applied, interval, repairs, resyncs, divergences = struct.unpack(">QQIQQQ", head[28:72])
        _frames(body, 3, kind)
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        name = _text(bytes(body[2]), "replica name (frame 2) of REPORT request", MAXIMUM_REPLICA_NAME_BYTES)
        if interval == 0:
            raise WireError(MALFORMED, "report interval of REPORT request is 0 ms; expected 1 or more")
        return Report(request_id, client_id, store, name, epoch, applied, interval, repairs, resyncs, divergences)
    _frames(body, 1, kind)
    return StatusRequest(request_id)


def decode_reply(
    body: Sequence[bytes],
    limits: Limits = DEFAULT_LIMITS,
    frame_cap: Optional[int] = None,
) -> Reply:
    """Reads a reply body (REQ; or a DEALER's message after its empty delimiter).

    `frame_cap` is step 6 of the spec's check order ("at most maximumBatch + 2 frames ... checked for every
    type"). It is off by default: the daemon sends RANGE replies of up to 10,000 actions (10,002 frames),
    which a receiver applying step 6 to replies would refuse. See README.md ("Spec findings").
    """
    if len(body) < 1:
        raise WireError(MALFORMED, "reply has no header frame")
    head = bytes(body[0])
    kind = _common(head, 0, REPLY_TYPES, "a reply")
    if len(head) < 12:
        raise WireError(MALFORMED, f"header (frame 0) is {len(head)} bytes; the request id needs 12")
    request_id = struct.unpack(">Q", head[4:12])[0]
    if frame_cap is not None and len(body) > frame_cap:
        raise WireError(TOO_LARGE, f"{_NAMES[kind]} has {len(body)} frames; at most {frame_cap}")
    _exact_header(head, kind, 0)
    if kind == ACCEPTED:
        epoch, first, count = struct.unpack(">QQI", head[12:32])
        _frames(body, 1, kind)
        _positive(first, "first seq", kind)
        _positive(count, "count", kind)
        _seq_run(first, count, kind)
        return Accepted(request_id, epoch, first, count)
    if kind == REJECTED:
        (index,) = struct.unpack(">I", head[12:16])
        _frames(body, 3, kind)
        code = check_rejection_code(bytes(body[1]))
        reason = check_reason(bytes(body[2]), "rejection reason (frame 2)")
        return Rejected(request_id, index, code, reason)
    if kind == SNAPSHOT_REPLY:
        epoch, seq = struct.unpack(">QQ", head[12:28])
        digest = head[28:60]
        _frames(body, 3, kind)
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        if len(body[2]) == 0:
            raise WireError(MALFORMED, "state (frame 2) of SNAPSHOT reply is empty")
        return Snapshot(request_id, store, epoch, seq, digest, bytes(body[2]))
    if kind == RANGE_REPLY:
        epoch, first = struct.unpack(">QQ", head[12:28])
        if len(body) < 2:
            raise WireError(MALFORMED, f"RANGE reply has {len(body)} frames; expected 2 or more")
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        _positive(first, "first seq", kind)
        _seq_run(first, len(body) - 2, kind)
        actions = [check_action(bytes(a), f"action {i}", limits) for i, a in enumerate(body[2:])]
        return Range(request_id, store, epoch, first, actions)
    if kind == RANGE_REPLY_BY:
        epoch, first = struct.unpack(">QQ", head[12:28])
        if len(body) < 4 or len(body) % 2:
            raise WireError(MALFORMED, f"RANGE_BY reply has {len(body)} frames; expected an even count of 4 or more")
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        count = (len(body) - 2) // 2
        _positive(first, "first seq", kind)
        _seq_run(first, count, kind)
        actions = [check_action(bytes(a), f"action {i}", limits) for i, a in enumerate(body[2:2 + count])]
        authors = [check_author(bytes(a), f"author {i}") for i, a in enumerate(body[2 + count:])]
        return Range(request_id, store, epoch, first, actions, authors)
    if kind == COMPACTED:
        epoch, first = struct.unpack(">QQ", head[12:28])
        _frames(body, 2, kind)
        store = check_store_name(bytes(body[1]), "store name (frame 1)")
        _positive(first, "first seq still in the journal", kind)
        return Compacted(request_id, store, epoch, first)
    if kind == STATUS_REPLY:
        _frames(body, 2, kind)
        return Status(request_id, bytes(body[1]))
    if kind == EFFECTS_REPLY:
        _frames(body, 2, kind)
        return Effects(request_id, bytes(body[1]))
    (code,) = struct.unpack(">H", head[12:14])
    _frames(body, 2, kind)
    return Error(request_id, code, check_reason(bytes(body[1]), "error reason (frame 1)"))


def decode_event(frames: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> Published:
    """Reads an events-socket message [topic, header(, action…)] of either stream."""
    if len(frames) < 2:
        raise WireError(MALFORMED, f"event message has {len(frames)} frames; expected a topic and a header")
    head = bytes(frames[1])
    kind = _common(head, 1, EVENT_TYPES, "an event")
    # An EVENTS_BY carries an author frame per action: twice the frames of an EVENTS of the same run.
    most = 2 * limits.maximum_batch + 2 if kind == EVENTS_BY else limits.maximum_batch + 2
    if len(frames) > most:
        raise WireError(TOO_LARGE, f"{_NAMES[kind]} has {len(frames)} frames; at most {most}")
    _exact_header(head, kind, 1)
    raw_topic = bytes(frames[0])
    if not raw_topic or raw_topic[-1] > 2:
        raise WireError(MALFORMED, "topic (frame 0) does not end in 0x00, 0x01 or 0x02")
    store = check_store_name(raw_topic[:-1], "store name in topic (frame 0)")
    if (kind == TRACE) != (raw_topic[-1] == 2):
        raise WireError(MALFORMED, f"{_NAMES[kind]} on a topic ending with {raw_topic[-1]:#04x}")
    if kind == TRACE:
        epoch, first_seq, last_seq = struct.unpack(">QQQ", head[4:28])
        _frames(frames, 3, kind)
        _positive(first_seq, "first seq", kind)
        if first_seq > last_seq:
            raise WireError(MALFORMED, f"TRACE names seqs {first_seq} to {last_seq}")
        return Trace(store, epoch, first_seq, last_seq, _trace_context(bytes(frames[2])))
    in_runs = raw_topic[-1] == 1
    if kind in (EVENT, EVENTS, EVENT_BY, EVENTS_BY) and in_runs != (kind in (EVENTS, EVENTS_BY)):
        raise WireError(MALFORMED, f"{_NAMES[kind]} on the topic of the other stream")
    epoch, seq = struct.unpack(">QQ", head[4:20])
    if kind == EVENTS_BY:
        if len(frames) < 4 or len(frames) % 2:
            raise WireError(MALFORMED, f"EVENTS_BY has {len(frames)} frames; expected an even count of 4 or more")
        count = (len(frames) - 2) // 2
        _positive(seq, "first seq", kind)
        _seq_run(seq, count, kind)
        actions = [check_action(bytes(f), f"action {i}", limits) for i, f in enumerate(frames[2:2 + count])]
        authors = [check_author(bytes(f), f"author {i}") for i, f in enumerate(frames[2 + count:])]
        return Events(store, epoch, seq, actions, authors)
    if kind == EVENT_BY:
        _frames(frames, 4, kind)
        _positive(seq, "seq", kind)
        action = check_action(bytes(frames[2]), "action (frame 2)", limits)
        return Event(store, epoch, seq, action, check_author(bytes(frames[3]), "author (frame 3)"))
    if kind == EVENTS:
        if len(frames) < 3:
            raise WireError(MALFORMED, f"EVENTS has {len(frames)} frames; expected at least 3")
        _positive(seq, "first seq", kind)
        _seq_run(seq, len(frames) - 2, kind)
        actions = [check_action(bytes(f), f"action {i} (frame {i + 2})", limits) for i, f in enumerate(frames[2:])]
        return Events(store, epoch, seq, actions)
    if kind == EVENT:
        _frames(frames, 3, kind)
        _positive(seq, "seq", kind)
        return Event(store, epoch, seq, check_action(bytes(frames[2]), "action (frame 2)", limits))
    if kind == HEARTBEAT:
        _frames(frames, 2, kind)
        return Heartbeat(store, epoch, seq)
    if kind == CHECKPOINT:
        _frames(frames, 2, kind)
        _positive(seq, "seq", kind)
        return Checkpoint(store, epoch, seq)
    _frames(frames, 2, kind)
    return Digest(store, epoch, seq, head[20:52])


# --------------------------------------------------------------------------------------------------
# Canonical JSON and digests


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _string(text: str) -> str:
    out = ['"']
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append("\\u%04x" % ord(char))
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def format_double(value: float) -> str:
    """A double as Swift's Double.description writes it, without a trailing ".0"."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError("NaN and infinities have no canonical JSON form")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()  # repr: the shortest digits that round-trip
    digits = list(digits)
    while len(digits) > 1 and digits[-1] == 0:
        digits.pop()
        exponent += 1
    text = "".join(map(str, digits))
    magnitude = abs(value)
    if 1e-4 <= magnitude <= 2.0**53:
        if exponent >= 0:
            body = text + "0" * exponent
        else:
            point = len(text) + exponent
            body = text[:point] + "." + text[point:] if point > 0 else "0." + "0" * (-point) + text
    else:
        scientific = exponent + len(text) - 1
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        body = "%se%s%02d" % (mantissa, "+" if scientific >= 0 else "-", abs(scientific))
    return ("-" if sign else "") + body


def _canonical(value: Any, out: List[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(format_double(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value, key=lambda k: k.encode("utf-8"))):
            if not isinstance(key, str):
                raise TypeError("object member names are strings")
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _canonical(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, element in enumerate(value):
            if index:
                out.append(",")
            _canonical(element, out)
        out.append("]")
    else:
        raise TypeError(f"no JSON form for {type(value).__name__}")


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of a JSON value (dict, list, str, int, float, bool, None)."""
    out: List[str] = []
    _canonical(value, out)
    return "".join(out).encode("utf-8")


INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def _number_from_float_text(text: str) -> Union[int, float]:
    number = Decimal(text)
    if number == number.to_integral_value() and INT64_MIN <= number <= INT64_MAX and not (
        number.is_zero() and number.is_signed()
    ):
        return int(number)
    return float(text)


def _number_from_int_text(text: str) -> Union[int, float]:
    number = int(text)
    if text.startswith("-") and number == 0:
        return -0.0
    return number if INT64_MIN <= number <= INT64_MAX else float(text)


def parse_json_value(text: Union[str, bytes]) -> Any:
    """Parses JSON text the way the canonical-json vectors read it: a number that is integral and within
    Int64 is an integer (1, 1.0, 1e2), except a negative zero, which is the double -0.0; any other number is
    a double."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(text, parse_float=_number_from_float_text, parse_int=_number_from_int_text)


def canonicalize(text: Union[str, bytes]) -> bytes:
    """The canonical form of the value some JSON text denotes."""
    return canonical_json(parse_json_value(text))


def digest(state_bytes: bytes) -> bytes:
    """A state's digest: SHA-256 of its digest form's bytes — its canonical JSON, unless part of it is condensed by
    `digested_dictionary` (docs/protocol.md "Digest forms")."""
    return hashlib.sha256(state_bytes).digest()


def digested_dictionary(members: Dict[str, Any], int_keys: bool) -> Dict[str, Any]:
    """What a Swift `DigestedDictionary` is in a state's digest form (docs/protocol.md "Digest forms"): its count, and
    the sum modulo 2**256 of each member's SHA-256 over the canonical JSON of [key, value], read big-endian.
    `members` is the dictionary as its canonical form's object (the keys are member names; `int_keys` reads them as
    integers, for a dictionary keyed by Int). A value holding a DigestedDictionary of its own is given in its digest
    form."""
    total = 0
    for name, value in members.items():
        key: Any = int(name) if int_keys else name
        total += int.from_bytes(hashlib.sha256(canonical_json([key, value])).digest(), "big")
    return {"count": len(members), "sum": format(total % (1 << 256), "064x")}
