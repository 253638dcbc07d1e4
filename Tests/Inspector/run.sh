#!/bin/sh
# The inspector's page in a real browser (Debian's chromium, headless, through chromium-driver and Selenium).
# Usage: Tests/Inspector/run.sh BIN_DIR   (BIN_DIR holds lockstepd and lockstep)
#   INSPECTOR_SCREENSHOT=docs/images/inspector.png Tests/Inspector/run.sh "$(swift build --show-bin-path)"
set -eu
here=$(cd "$(dirname "$0")" && pwd)
LOCKSTEP_BIN=$(cd "$1" && pwd)
export LOCKSTEP_BIN
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import selenium, zmq' 2>/dev/null && [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || {
    echo "run.sh: needs Debian's chromium, chromium-driver, python3-selenium and python3-zmq (make inspector installs them)" >&2
    exit 2
}
PYTHONDONTWRITEBYTECODE=1 exec "$python" -m unittest discover -s "$here" -t "$here" -v
