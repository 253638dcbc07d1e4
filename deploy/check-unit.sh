#!/usr/bin/env bash
# Checks deploy/lockstepd.service with systemd-analyze: it must verify cleanly and score at most 2.0 on
# `systemd-analyze security --offline=true`. Needs systemd-analyze (Debian: apt-get install systemd).
# ExecStart must name an existing binary, so the check runs on a copy pointing at the built lockstepd (or $LOCKSTEPD).
# deploy/systemd-test.sh runs the unit under a real systemd.
set -euo pipefail
cd "$(dirname "$0")/.."
binary="${LOCKSTEPD:-$(swift build --show-bin-path)/lockstepd}"
[ -x "$binary" ] || { echo "check-unit: build lockstepd first (make build)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sed "s|^ExecStart=.*|ExecStart=$binary|" deploy/lockstepd.service > "$work/lockstepd.service"
systemd-analyze verify "$work/lockstepd.service"
score="$(systemd-analyze security --offline=true "$work/lockstepd.service" | sed -n 's/.*Overall exposure level for lockstepd.service: \([0-9.]*\).*/\1/p')"
echo "check-unit: verify passed; exposure $score (at most 2.0 required)"
awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 2.0) }'
