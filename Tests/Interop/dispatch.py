"""A Python client process: one DISPATCH through `Dispatcher`, as a tool makes it, following the leader of the
daemons given (docs/protocol.md, "Failover"). The failover test starts it while a takeover is under way.

    python3 dispatch.py --endpoint CMD [--endpoint CMD …] STORE ACTION_JSON [--timeout S] [--retries N]

Prints {"seq": N} and exits 0 when the action was accepted; 3 when the store's validator rejected it; 69 when no
daemon led within the tries; 1 for any other answer.
"""

from __future__ import annotations

import argparse
import json
import sys

import lockstep_wire as wire
from client import Dispatcher, NoReply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", action="append", required=True, help="a daemon's command endpoint")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds per try")
    parser.add_argument("--retries", type=int, default=20, help="tries after the first")
    parser.add_argument("--domain-version", type=int, default=1)
    parser.add_argument("store")
    parser.add_argument("action", help="the action's JSON")
    arguments = parser.parse_args()
    with Dispatcher(arguments.endpoint, timeout=arguments.timeout, retries=arguments.retries) as dispatcher:
        try:
            reply = dispatcher.dispatch(arguments.store, [arguments.action.encode()], arguments.domain_version)
        except NoReply as error:
            print(f"dispatch.py: {error}", file=sys.stderr)
            return 69
    if isinstance(reply, wire.Accepted):
        print(json.dumps({"seq": reply.first_seq, "refusals": dispatcher.refusals}))
        return 0
    print(f"dispatch.py: {reply}", file=sys.stderr)
    return 3 if isinstance(reply, wire.Rejected) else 1


if __name__ == "__main__":
    sys.exit(main())
