#!/bin/sh
# Runs the Python interop suite against a real lockstepd.
# Usage: Tests/Interop/run.sh [BIN_DIR]   (BIN_DIR holds lockstepd and lockstep; default: .build/debug)
#   e.g. Tests/Interop/run.sh "$(swift build --show-bin-path)"
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then
    LOCKSTEP_BIN=$(cd "$1" && pwd)
    export LOCKSTEP_BIN
fi
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import zmq' 2>/dev/null || {
    echo "run.sh: $python cannot import zmq; install Debian's python3-zmq (apt-get install python3-zmq)" >&2
    exit 2
}
PYTHONDONTWRITEBYTECODE=1 exec "$python" -m unittest discover -s "$here" -t "$here" -v
