#!/usr/bin/env bash
# The template end to end, in a fresh temporary folder: boardd, its timer (a card long overdue is flagged) and its
# effect (a card moved into done is notified once, through a crash of boardd between the run and its result), two
# board-clients dispatching at once, the daemon's own state, a clean SIGTERM, then the tool on the journal the daemon
# left behind.
#
#   bash docs/tutorial/smoke.sh "$(swift build --package-path docs/tutorial --show-bin-path)"
#
# Every wait is bounded; every process it starts is killed (by PID) and the folder removed on any exit.
set -euo pipefail

usage="usage: smoke.sh BIN_PATH   (from: swift build --package-path docs/tutorial --show-bin-path)"
[[ $# -eq 1 && -d $1 ]] || { echo "$usage" >&2; exit 64; }
bin=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
for exe in boardd board board-client; do
    [[ -x $bin/$exe ]] || { echo "smoke: $bin/$exe is missing; build the template first" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
    local status=$?
    for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL "$pid" 2>/dev/null || true; done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

fail() {
    echo "smoke: FAIL: $*" >&2
    for log in "$work"/*.log "$work"/*.err; do
        [[ -s $log ]] && { echo "--- last lines of $(basename "$log"):" >&2; tail -n 15 "$log" >&2; }
    done
    exit 1
}
check() { echo "smoke: $*"; }

# Waits at most $2 seconds for process $1 (a child of this shell) to exit; sets `exit_status`.
wait_for_exit() {
    local pid=$1 deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "process $pid still running after $2 s"
        sleep 0.1
    done
    exit_status=0
    wait "$pid" || exit_status=$?
    # Reaped: its PID may be reused, so the cleanup must not signal it any more.
    local kept=() other
    for other in ${pids[@]+"${pids[@]}"}; do [[ $other == "$pid" ]] || kept+=("$other"); done
    pids=(${kept[@]+"${kept[@]}"})
}

# The value of "key" (a hex string or a number) in the first line of JSON or key=value text that has it.
field() { grep -o -m1 -E "\"?$1\"?[=:]\"?[0-9a-f]+" | head -n1 | sed -E 's/.*[=:]"?//'; }

# Waits at most $2 seconds until the daemon's board (`board state board --json`, canonical JSON: keys sorted) matches
# the extended regular expression $1.
wait_for_board() {
    local deadline=$((SECONDS + $2))
    until "$bin/board" state board --json >board-now.json 2>/dev/null && grep -qE "$1" board-now.json; do
        ((SECONDS < deadline)) || fail "the board did not match '$1' within $2 s; it is $(cat board-now.json)"
        sleep 0.1
    done
}

# Starts boardd, its output to $1 and the environment after it added to this one's, and waits at most 20 s until
# 'board stats' answers; sets `daemon`.
start_boardd() {
    local log=$1
    shift
    env "$@" "$bin/boardd" >"$log" 2>&1 &
    daemon=$!
    pids+=("$daemon")
    local deadline=$((SECONDS + 20))
    until "$bin/board" stats --timeout-ms 500 --retries 0 >stats.out 2>/dev/null; do
        kill -0 "$daemon" 2>/dev/null || fail "boardd exited before it answered"
        ((SECONDS < deadline)) || fail "boardd did not answer 'board stats' within 20 s"
        sleep 0.2
    done
}

cd "$work"
started=$SECONDS

# LOCKSTEP_FAILPOINT=effect-ran: a debug build of boardd kills itself (SIGKILL) when its first effect's run has
# ended, before what it returned is journaled. A release build ignores it, and says so in its log.
check "starting boardd in $work (journal in ./.lockstep/data, sockets in ./.lockstep/run), with the failpoint"
check "  LOCKSTEP_FAILPOINT=effect-ran, and waiting (at most 20 s) until 'board stats' answers"
start_boardd boardd.log LOCKSTEP_FAILPOINT=effect-ran
crash=1
! grep -q 'LOCKSTEP_FAILPOINT is ignored' boardd.log || crash=0

# Effects and timers (docs/effects.md). Card 1 is due in 2023: its timer fires at once and flags it overdue. Card 2
# is due in 2100: its move into done cancels its timer and runs the notify effect, which boardd's handler sends to
# the stand-in service (one file per notification in .lockstep/data/notifications, named by its idempotency key);
# boardd kills itself there, and once restarted runs the effect again: the service sends nothing again, and the
# receipt comes back as an action, once.
past=1700000000000   # 2023-11-14T22:13:20Z
future=4102444800000 # 2100-01-01T00:00:00Z
check "effects and timers: adding card 1, due in 2023, and card 2, due in 2100"
"$bin/board" dispatch board '{"addColumn":{"name":"todo","wipLimit":3}}' '{"addColumn":{"name":"done","wipLimit":3}}' \
    "{\"addCard\":{\"title\":\"Late\",\"column\":\"todo\",\"dueMilliseconds\":$past}}" \
    "{\"addCard\":{\"title\":\"Ship it\",\"column\":\"todo\",\"dueMilliseconds\":$future}}" >added.log 2>&1 \
    || fail "'board dispatch' of two columns and two cards exited $?"
"$bin/board" effects >effects-set.out 2>&1 || fail "'board effects' exited $?"
grep -qE '^board/due-2 +2100-01-01T00:00:00Z' effects-set.out || fail "'board effects' lists no timer for card 2"
check "  'board effects' lists card 2's timer: $(grep -E '^board/due-2 ' effects-set.out | tr -s ' ')"
wait_for_board '"id":1,"overdue":true' 20
check "  card 1's timer fired: card 1 is overdue"
if ((crash)); then
    check "  moving card 2 into done: boardd runs its notification, then its failpoint kills it (bash says: Killed)"
else
    check "  moving card 2 into done (boardd is not a debug build: it ignores the failpoint)"
fi
"$bin/board" dispatch board --json '{"moveCard":{"id":2,"to":"done"}}' >moved.json 2>&1 \
    || fail "'board dispatch' of card 2's move into done exited $?"
moved=$(field seq <moved.json)
# The move's effects: 0 cancels card 2's timer, 1 is the notification; its id is the service's idempotency key.
key=board/$moved/1
notifications=.lockstep/data/notifications
if ((crash)); then
    wait_for_exit "$daemon" 20
    ((exit_status == 137)) || fail "boardd exited $exit_status, not 137 (SIGKILL, by its failpoint)"
    [[ -f $notifications/board-$moved-1.json ]] || fail "boardd was killed before its handler sent $key"
    "$bin/board" journal dump .lockstep/data --store board >dump-killed.jsonl 2>&1 \
        || fail "'board journal dump' exited $?"
    if grep -q '"notified"' dump-killed.jsonl; then fail "the receipt was journaled before boardd was killed"; fi
    check "  boardd was killed after notification $key was sent, before its receipt was journaled"
    check "  restarting boardd: it runs $key again, and the service, which has that key, sends nothing again"
    start_boardd boardd-restarted.log
fi
wait_for_board "\"id\":2,\"receipt\":\"notified:$key\"" 20
check "  card 2 has the receipt of notification $key"
[[ $(ls -A "$notifications") == "board-$moved-1.json" ]] \
    || fail "the service holds '$(ls -A "$notifications")', not the one notification board-$moved-1.json"
grep -q '"card":2' "$notifications/board-$moved-1.json" || fail "the notification is $(cat "$notifications"/*)"
"$bin/board" effects >effects-done.out 2>&1 || fail "'board effects' exited $?"
(($(grep -c '^(none)$' effects-done.out) == 2)) || fail "effects or timers are left: $(cat effects-done.out)"
"$bin/board" stats >stats-effects.out 2>&1 || fail "'board stats' exited $?"
grep -qE '^board .* 0 pending, 0 dead, 0 timers$' stats-effects.out \
    || fail "'board stats' shows $(cat stats-effects.out)"
check "  'board effects' lists no effect and no timer left; 'board stats': 0 pending, 0 dead, 0 timers"

check "running two board-clients at once, 200 generated actions each"
"$bin/board-client" --actions 200 --seed 1 >client1.out 2>client1.err &
client1=$!
"$bin/board-client" --actions 200 --seed 2 >client2.out 2>client2.err &
client2=$!
pids+=("$client1" "$client2")
for n in 1 2; do
    pid=client$n
    wait_for_exit "${!pid}" 90
    ((exit_status == 0)) || fail "board-client $n exited $exit_status"
    grep -qE '^seq=[0-9]+ digest=[0-9a-f]{64}$' "client$n.out" || fail "board-client $n printed '$(cat "client$n.out")'"
    summary=$(sed -n 's/^board-client: sent/sent/p' "client$n.err")
    check "  board-client $n: $(cat "client$n.out")  ($summary)"
done
# Each synced to the daemon's seq when it was done, and the one done last holds every action of both: its seq is at
# least the other's. Each one's digest is checked against the journal's state at its seq once the daemon stops.
seq1=$(field seq <client1.out)
seq2=$(field seq <client2.out)
((seq1 > 0 && seq2 > 0)) || fail "a client's final seq is 0: nothing was committed"
# The generated due times are in 2024: every timer they set has fired (or a move into done or a removal cancelled
# it), and every move into done was notified.
deadline=$((SECONDS + 20))
until "$bin/board" stats >stats-clients.out 2>&1 \
    && grep -qE '^board .* 0 pending, 0 dead, 0 timers$' stats-clients.out; do
    ((SECONDS < deadline)) || fail "effects or timers are left after the clients: $(cat stats-clients.out)"
    sleep 0.1
done
check "every timer the clients set fired or was cancelled, every effect ran ($(ls "$notifications" | wc -l) notified)"

check "reading the daemon's state with 'board state board --json'"
"$bin/board" state board --json >state.json || fail "'board state board --json' exited $?"
seq=$(field seq <state.json)
digest=$(field digest <state.json)
((seq >= seq1 && seq >= seq2)) || fail "the daemon is at seq $seq, behind a client (at $seq1 and $seq2)"
check "  the daemon holds seq $seq with digest $digest"

check "stopping boardd with SIGTERM (it must exit 0 within 20 s)"
kill -TERM "$daemon"
wait_for_exit "$daemon" 20
((exit_status == 0)) || fail "boardd exited $exit_status after SIGTERM"

data=$work/.lockstep/data
check "replaying the journal in $data through the reducer"
"$bin/board" replay --journal "$data" >replay.log 2>&1 || fail "'board replay --journal' exited $?"

check "rebuilding the state at each client's seq, the daemon's, and seq 1 from the journal with 'board journal state'"
for held in client1.out client2.out state.json; do
    at=$(field seq <"$held")
    "$bin/board" journal state "$data" board --seq "$at" --json >journal-state.json \
        || fail "'board journal state --seq $at' exited $?"
    [[ $(field digest <journal-state.json) == "$(field digest <"$held")" ]] \
        || fail "the journal's state at seq $at has digest $(field digest <journal-state.json), $held has $(cat "$held")"
    check "  seq $at: the journal's digest is the one in $held"
done
"$bin/board" journal state "$data" board --seq 1 --json >journal-state-1.json \
    || fail "'board journal state --seq 1' exited $?"
[[ $(field seq <journal-state-1.json) == 1 ]] || fail "'board journal state --seq 1' printed $(cat journal-state-1.json)"

check "running actions in a fresh in-process store with 'board run'"
"$bin/board" run board --json '{"addColumn":{"name":"todo","wipLimit":2}}' \
    '{"addCard":{"title":"Write the tutorial","column":"todo"}}' >run.log 2>&1 || fail "'board run' exited $?"
grep -q '"title":"Write the tutorial"' run.log || fail "'board run' did not print the new card"
status=0
"$bin/board" run board '{"addCard":{"title":"Ship","column":"nowhere"}}' >refused.err 2>&1 || status=$?
((status == 3)) && grep -q unknown_column refused.err || fail "a refused action gave exit $status, not 3 with its code"

check "checking the journal applied the receipt of $key once, and the service sent it once"
"$bin/board" journal dump "$data" --store board >dump.jsonl 2>&1 || fail "'board journal dump' exited $?"
applied=$(grep -c "\"notified\":{\"id\":2,\"receipt\":\"notified:$key\"}" dump.jsonl || true)
((applied == 1)) || fail "the receipt of $key was applied $applied times"
sent=$(grep -l "\"key\":\"$key\"" "$data"/notifications/*.json | wc -l)
((sent == 1)) || fail "the service sent $key $sent times"

check "verifying the journal with 'board journal verify'"
"$bin/board" journal verify "$data" >verify.log 2>&1 || fail "'board journal verify' exited $?"

# Roles (deploy/roles.toml, docs/security.md): a member may move cards, an observer may only read. It runs as root,
# as CI does: it makes the two OS users and groups (kept for the next run), and runs the tool as each with setpriv.
if ((EUID == 0)); then
    check "roles: boardd with deploy/roles.toml; a member moves a card, an observer reads and is refused a move"
    getent group board-members >/dev/null || groupadd --system board-members
    getent group board-observers >/dev/null || groupadd --system board-observers
    for role in member observer; do
        id "board-$role" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin -U "board-$role"
        usermod -aG "board-${role}s" "board-$role"
    done
    roles=$work/roles && mkdir -p "$roles/.lockstep/run" && chmod 755 "$work" "$roles" "$roles/.lockstep" "$roles/.lockstep/run"
    cd "$roles"
    # umask 0: the sockets open to every local user, as UMask=0000 would; the policy decides what each may do.
    (umask 000 && exec "$bin/boardd" --config "$here/deploy/roles.toml" --journal memory) >boardd-roles.log 2>&1 &
    daemon=$!
    pids+=("$daemon")
    deadline=$((SECONDS + 20))
    until "$bin/board" stats --timeout-ms 500 --retries 0 >/dev/null 2>&1; do
        kill -0 "$daemon" 2>/dev/null || fail "boardd with roles.toml exited: $(cat boardd-roles.log)"
        ((SECONDS < deadline)) || fail "boardd with roles.toml did not answer within 20 s"
        sleep 0.2
    done
    as() { local user=$1; shift; setpriv --reuid="$user" --regid="$user" --init-groups "$bin/board" "$@"; }
    "$bin/board" dispatch board '{"addColumn":{"name":"todo","wipLimit":3}}' '{"addColumn":{"name":"done","wipLimit":3}}' \
        >/dev/null || fail "the admin (root) could not add the columns"
    as board-member dispatch board '{"addCard":{"title":"Mine","column":"todo"}}' '{"moveCard":{"id":1,"to":"done"}}' \
        >member.out 2>&1 || fail "the member could not add and move a card: $(cat member.out)"
    as board-observer state board --json >observer-state.json 2>&1 || fail "the observer could not read: $(cat observer-state.json)"
    grep -q '"title":"Mine"' observer-state.json || fail "the observer reads $(cat observer-state.json)"
    status=0
    as board-observer dispatch board '{"moveCard":{"id":1,"to":"todo"}}' >observer.err 2>&1 || status=$?
    ((status == 77)) && grep -q "identity 'observer' may not dispatch to store 'board'" observer.err \
        || fail "the observer's move gave exit $status: $(cat observer.err)"
    status=0
    as board-member dispatch board '{"removeCard":{"id":1}}' >member-remove.err 2>&1 || status=$?
    ((status == 77)) && grep -q "may not dispatch action 'removeCard'" member-remove.err \
        || fail "the member's removeCard gave exit $status: $(cat member-remove.err)"
    check "  member: added and moved card 1; observer: read it, its move refused ($(head -c 120 observer.err))"
    kill -TERM "$daemon"
    wait_for_exit "$daemon" 20
    cd "$work"
elif [[ ${SYSTEMD_TEST_REQUIRED:-} == 1 ]]; then
    fail "roles: this run requires everything (SYSTEMD_TEST_REQUIRED=1, as CI sets), and the roles need root to make OS users"
else
    check "roles: skipped, not root (it makes OS users); CI runs it as root"
fi

check "all checks passed in $((SECONDS - started)) s"
