#!/bin/sh
# Runs the unsyncedfs tests (Tests/PowerCut/README.md). Installs fuse3 and python3-fusepy with apt when missing.
# Exits non-zero when a test fails. Skips (with a message, exit 0) only when FUSE cannot be used on this machine:
# not root, no /dev/fuse, /dev/fuse not openable, or no CAP_SYS_ADMIN (mount(2) would be refused) — unless
# POWERCUT_REQUIRED=1 (CI sets it), when that fails the run, naming what is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-/usr/bin/python3}

skip() {
    if [ "${POWERCUT_REQUIRED:-0}" = 1 ]; then
        echo "run.sh: the power-cut filesystem tests cannot run, and POWERCUT_REQUIRED=1: $*" >&2
        exit 1
    fi
    echo "run.sh: SKIPPED the power-cut filesystem tests: $*" >&2
    exit 0
}

[ "$(id -u)" -eq 0 ] || skip "they need root (they mount FUSE filesystems); run as root to test"
[ -c /dev/fuse ] || skip "there is no /dev/fuse here (a container without the FUSE device?)"
[ -x "$python" ] || { echo "run.sh: $python not found; install Debian's python3" >&2; exit 2; }
"$python" -c 'import os; os.close(os.open("/dev/fuse", os.O_RDWR))' 2>/dev/null ||
    skip "/dev/fuse cannot be opened here (a container's device policy?)"
"$python" -c '
import sys
caps = [l for l in open("/proc/self/status") if l.startswith("CapEff:")][0].split()[1]
sys.exit(0 if int(caps, 16) >> 21 & 1 else 1)' || skip "no CAP_SYS_ADMIN here, so mount(2) is refused"

missing=""
dpkg-query -W -f='${Status}\n' fuse3 2>/dev/null | grep -q "install ok installed" || missing="$missing fuse3"
"$python" -c 'import fusepy' 2>/dev/null || missing="$missing python3-fusepy"
if [ -n "$missing" ]; then
    echo "run.sh: installing$missing with apt" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q $missing >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $missing; }
    "$python" -c 'import fusepy' || { echo "run.sh: python3-fusepy did not install" >&2; exit 2; }
fi

# Every wait in the tests is bounded; this bounds the whole run too (SIGTERM to the group unmounts cleanly).
status=0
PYTHONDONTWRITEBYTECODE=1 timeout -k 10 300 "$python" -m unittest discover -s "$here" -t "$here" -v || status=$?
if grep ' fuse.unsyncedfs ' /proc/mounts | grep -q unsyncedfs-test-; then
    echo "run.sh: test mounts left behind:" >&2
    grep unsyncedfs-test- /proc/mounts >&2
    status=1
fi
exit $status
