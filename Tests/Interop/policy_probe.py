#!/usr/bin/env python3
"""Tries what a peer may and may not do against a daemon with a policy (docs/security.md), as whichever OS user runs
it (the tests start it under others with setpriv) or with a CURVE key.

Usage:
  policy_probe.py requests COMMAND_ENDPOINT [--curve SERVER CLIENT_PUBLIC CLIENT_SECRET] STEP...
      STEP is dispatch:STORE:JSON, snapshot:STORE, range:STORE:FROM:TO or status. Prints one JSON line per step:
      {"step": …, "reply": "accepted"|"rejected"|"snapshot"|"range"|"status"|"error", "code": …, "reason": …,
      "authors": "a,b" (a range's)}.
  policy_probe.py subscribe EVENTS_ENDPOINT [--curve SERVER CLIENT_PUBLIC CLIENT_SECRET] STORE...
      Subscribes to each store's one-by-one stream (a store it may not read too: the daemon must keep those events
      from it) and prints one JSON line per message received, {"store": …, "type": …, "seq": …, "author": …}, first
      {"ready": true} once the socket is connected; runs until stdin closes.
"""
import json
import os
import select
import sys

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep_wire as wire  # noqa: E402
from client import Dispatcher, configure_curve  # noqa: E402


def emit(value) -> None:
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
    sys.stdout.flush()


def curve_option(args):
    if len(args) >= 4 and args[0] == "--curve":
        return tuple(args[1:4]), args[4:]
    return None, args


def requests(endpoint: str, args) -> None:
    curve, steps = curve_option(args)
    with Dispatcher(endpoint, timeout=15.0, retries=2, curve=curve) as dispatcher:
        for step in steps:
            kind, _, rest = step.partition(":")
            if kind == "dispatch":
                store, _, action = rest.partition(":")
                reply = dispatcher.dispatch(store, [action.encode()])
            elif kind == "snapshot":
                reply = dispatcher.snapshot(rest)
            elif kind == "range":
                store, first, last = rest.split(":")
                reply = dispatcher.range(store, int(first), int(last))
            elif kind == "status":
                reply = dispatcher.call(wire.StatusRequest(dispatcher.new_request_id()))
            else:
                raise SystemExit(f"policy_probe.py: unknown step {step!r}")
            line = {"step": step, "reply": type(reply).__name__.lower()}
            if isinstance(reply, wire.Range):
                line["authors"] = ",".join(reply.authors)
            if isinstance(reply, wire.Error):
                line.update(code=reply.name, reason=reply.reason)
            emit(line)


def subscribe(endpoint: str, args) -> None:
    curve, stores = curve_option(args)
    context = zmq.Context.instance()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        configure_curve(sock, curve)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    for store in stores:
        sock.setsockopt(zmq.SUBSCRIBE, wire.topic(store))
    sock.connect(endpoint)
    if not monitor.poll(60_000):
        raise SystemExit(f"policy_probe.py: no handshake with {endpoint} within 60 s")
    emit({"ready": True})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while True:
        if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
            return
        for _ in poller.poll(100):
            message = wire.decode_event(sock.recv_multipart())
            seq = getattr(message, "seq", getattr(message, "last_seq", None))
            emit({"store": message.store, "type": type(message).__name__.lower(), "seq": seq,
                  "author": getattr(message, "author", "")})


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("requests", "subscribe"):
        raise SystemExit(__doc__)
    (requests if sys.argv[1] == "requests" else subscribe)(sys.argv[2], sys.argv[3:])
