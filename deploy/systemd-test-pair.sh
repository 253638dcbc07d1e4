# Sourced by deploy/systemd-test.sh --pair (not run alone): a failover pair of lockstepd under the container's
# systemd, on the container's PostgreSQL. deploy/lockstepd.service is installed as the template lockstepd@.service
# with deploy/lockstepd@.service.d/instance.conf (per-instance configuration, sockets, state, the password as a
# credential), and run as lockstepd@a and lockstepd@b. Checks, each wait bounded:
#   database  PostgreSQL starts; a role lockstepd (LOGIN, nothing else), a database it may only connect to, and a
#             schema it owns
#   journal   lockstepd@a creates the journal at its first start; then its schema and tables go to a NOLOGIN owner,
#             and lockstepd keeps USAGE and SELECT, INSERT, UPDATE, DELETE: the pair runs on those alone
#   pair      a leads (STATUS=serving…), b is active as a standby (STATUS=standby, leader a term N, in systemctl
#             status); `lockstep stats` given both endpoints shows one of each; dispatches given both are accepted
#   takeover  the leader's main PID killed (SIGKILL) under load: the standby says serving within 5 s (timed), logs
#             "took the journal's lease: leading"; systemd restarts the killed instance, which comes back as a
#             standby; a `lockstep dispatch` and a demo-client service given both daemons get every dispatch
#             acknowledged, the demo-client's replica follows (no divergence)
#   journal   every acknowledged dispatch is in the journal once: the store's seq, the events' rows,
#             `lockstep journal verify --postgres`
#   stop, log both stop cleanly; no SIGSYS, EPERM or assertion in either log; the one kill is the test's
# It uses the main script's helpers (ct, as, as_bg, reap, field, acks, say, pass, fail, now, since).

pair_dropin=deploy/lockstepd@.service.d/instance.conf
pair_names=(a b)
pg_conninfo="host=127.0.0.1 dbname=lockstep user=lockstepd"
pg_password=""

# The drop-in's value of KEY (its last, non-empty), with %i as instance $2.
dropin_value() { sed -n "s/^$1=\(..*\)$/\1/p" "$pair_dropin" | tail -n 1 | sed "s/%i/$2/g"; }

# Before the boot: the unit as a template with the shipped drop-in, a drop-in for the test, each instance's TOML,
# and the database password as root's file.
pair_install() {
    [[ -f $pair_dropin ]] || fail "no $pair_dropin"
    local exec
    exec=$(dropin_value ExecStart a | awk '{print $1}')
    [[ $exec == "$daemon_path" ]] || fail "$pair_dropin starts $exec, not the unit's $daemon_path"
    install -D -m 0644 "$unit_file" "$upper/etc/systemd/system/$unit@.service"
    install -D -m 0644 "$pair_dropin" "$upper/etc/systemd/system/$unit@.service.d/instance.conf"
    cat >"$upper/etc/systemd/system/$unit@.service.d/systemd-test.conf" <<EOF
# deploy/systemd-test.sh --pair only.
[Service]
# A refused system call kills the daemon with SIGSYS rather than failing with EPERM (libpq's calls included): a
# library that handles the EPERM quietly would hide a call the filter refuses.
SystemCallErrorNumber=kill
EOF
    pg_password=$(head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)
    mkdir -p "$upper/etc/lockstep"
    local name
    for name in "${pair_names[@]}"; do
        cat >"$upper/etc/lockstep/$name.toml" <<EOF
# lockstepd@$name (deploy/systemd-test.sh --pair). Sockets and state: the instance's RuntimeDirectory= and
# StateDirectory=; the password: PGPASSFILE, the unit's credential.
journal = "postgres"
postgres = "$pg_conninfo"

[lease]
name = "$name"
EOF
    done
    (umask 077 && echo "127.0.0.1:5432:lockstep:lockstepd:$pg_password" >"$upper/etc/lockstep/pgpass")
}

# A property of unit $1 (an instance name is enough: a, b).
uprop() { ct systemctl show -p "$2" --value "$(unit_of "$1")"; }
unit_of() { case $1 in a | b) echo "$unit@$1.service" ;; *) echo "$1.service" ;; esac; }
ulog() { ct journalctl -u "$(unit_of "$1")" --no-pager -o short-monotonic; }
# Lines of unit $1's log matching $2 (none is not an error).
ulog_grep() { local log; log=$(ulog "$1"); grep -E -- "$2" <<<"$log" || true; }
# SQL as the database's superuser, over its Unix socket; quiet, tuples only, stopping at the first error.
psql_admin() { ct setpriv --reuid=postgres --regid=postgres --init-groups psql -X -q -t -A -v ON_ERROR_STOP=1 "$@"; }

pair_run() {
    local phase name pg_unit pg_version a_cmd b_cmd status_b stats term killed took new_pid
    diag_units=("$unit@a" "$unit@b")
    for name in "${pair_names[@]}"; do
        [[ $(dropin_value RuntimeDirectory "$name") == ?* ]] || fail "$pair_dropin sets no RuntimeDirectory="
    done
    a_cmd="ipc:///run/$(dropin_value RuntimeDirectory a)/command"
    b_cmd="ipc:///run/$(dropin_value RuntimeDirectory b)/command"
    both=(--command-endpoint "$a_cmd" --command-endpoint "$b_cmd")

    # --- The database: the Debian package's cluster, a role with nothing but LOGIN, a database it may only connect
    # to, and a schema of its own for the journal (PostgreSQL 15 lets nobody but the owner create in public). ---
    phase=$(now)
    pg_unit=$(ct sh -c 'ls /etc/postgresql' | head -n 1)
    [[ $pg_unit =~ ^[0-9]+$ ]] || fail "no PostgreSQL cluster in the root (/etc/postgresql holds '$pg_unit')"
    pg_unit=postgresql@$pg_unit-main
    diag_units+=("$pg_unit")
    ct systemctl start "$pg_unit.service" || fail "systemctl start $pg_unit exited $?"
    deadline=$((SECONDS + 30))
    until ct pg_isready -q -h 127.0.0.1 -t 1; do
        ((SECONDS < deadline)) || fail "PostgreSQL ($pg_unit) does not accept connections on 127.0.0.1 after 30 s"
        sleep 0.2
    done
    pg_version=$(psql_admin -c 'SHOW server_version') || fail "psql as postgres exited $?"
    psql_admin >/dev/null <<EOF || fail "creating the role and the database exited $?"
CREATE ROLE lockstepd LOGIN PASSWORD '$pg_password';
CREATE DATABASE lockstep;
REVOKE ALL ON DATABASE lockstep FROM PUBLIC;
GRANT CONNECT ON DATABASE lockstep TO lockstepd;
ALTER ROLE lockstepd IN DATABASE lockstep SET search_path = lockstep;
\\connect lockstep
CREATE SCHEMA lockstep AUTHORIZATION lockstepd;
EOF
    pass "database: PostgreSQL ${pg_version%% *} ($pg_unit) up; role lockstepd (LOGIN, password), database lockstep (CONNECT for lockstepd only), schema lockstep owned by it ($(since "$phase") s)"

    # --- The first start creates the journal; then the daemons keep only what its commits and reads need. ---
    phase=$(now)
    ct systemctl start "$unit@a.service" || fail "the first systemctl start $unit@a exited $?"
    [[ $(uprop a StatusText) == "serving "* ]] \
        || fail "after its first start, $unit@a says '$(uprop a StatusText)', not 'serving …'"
    local tables
    tables=$(psql_admin -d lockstep -c "SELECT string_agg(tablename, ' ' ORDER BY tablename) FROM pg_tables WHERE schemaname = 'lockstep' AND tableowner = 'lockstepd'")
    [[ $tables == "effects events idempotency journal_format leadership snapshots store_versions stores timers" ]] \
        || fail "after the first start, schema lockstep holds '$tables' owned by lockstepd, not the journal's 9 tables"
    ct systemctl stop "$unit@a.service" || fail "systemctl stop $unit@a exited $?"
    psql_admin -d lockstep >/dev/null <<EOF || fail "taking the journal's ownership from lockstepd exited $?"
CREATE ROLE lockstep_owner NOLOGIN;
REASSIGN OWNED BY lockstepd TO lockstep_owner;
GRANT USAGE ON SCHEMA lockstep TO lockstepd;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA lockstep TO lockstepd;
EOF
    local owned
    owned=$(psql_admin -d lockstep -c "SELECT has_schema_privilege('lockstepd', 'lockstep', 'CREATE'), count(*) FILTER (WHERE tableowner = 'lockstep_owner'), count(*) FROM pg_tables WHERE schemaname = 'lockstep'")
    [[ $owned == "f|9|9" ]] || fail "after the hand-over: CREATE on the schema, tables owned by lockstep_owner, tables = '$owned', expected f|9|9"
    pass "journal: $unit@a created its 9 tables at the first start; they and the schema now belong to lockstep_owner (NOLOGIN), and lockstepd has USAGE and SELECT, INSERT, UPDATE, DELETE only ($(since "$phase") s)"

    # --- The pair: a leads, b stands by; both answer, the tool finds the leader. ---
    phase=$(now)
    ct systemctl start "$unit@a.service" || fail "systemctl start $unit@a exited $?"
    [[ $(uprop a StatusText) == "serving "* ]] || fail "$unit@a says '$(uprop a StatusText)', not 'serving …'"
    stats=$(as lsmember "${T[@]}" stats --command-endpoint "$a_cmd" --retries 0 --timeout-ms 5000) \
        || fail "'$tool_name stats' of $unit@a exited $?: $stats"
    [[ $stats =~ role\ +leader\ as\ a\ \(leader\ a,\ term\ ([0-9]+)\) ]] || fail "$unit@a does not say it leads: $stats"
    term=${BASH_REMATCH[1]}
    ct systemctl start "$unit@b.service" || fail "systemctl start $unit@b exited $?"
    [[ $(uprop b ActiveState) == active ]] || fail "after systemctl start, $unit@b is $(uprop b ActiveState), not active"
    status_b=$(ct systemctl status --no-pager --lines=0 "$unit@b.service" 2>&1) || true
    grep -qF "Status: \"standby, leader a term $term\"" <<<"$status_b" \
        || fail "systemctl status $unit@b does not show Status: \"standby, leader a term $term\": $status_b"
    stats=$(as lsmember "${T[@]}" stats "${both[@]}" --retries 0 --timeout-ms 5000) \
        || fail "'$tool_name stats' given both daemons exited $?: $stats"
    grep -qx "role     leader as a (leader a, term $term)" <<<"$stats" \
        && grep -qx "role     standby as b (leader a, term $term)" <<<"$stats" \
        || fail "'$tool_name stats' given both daemons does not show a leading and b standing by: $stats"
    # Each instance's directories as the unit makes them: the sockets for the group only, the state the daemon's.
    local dir_info socket_info socket_mode state_mode
    for name in "${pair_names[@]}"; do
        dir_info=$(ct stat -c '%a %G' "/run/$(dropin_value RuntimeDirectory "$name")")
        socket_info=$(ct stat -c '%a %G' "/run/$(dropin_value RuntimeDirectory "$name")/command")
        state_mode=$(ct stat -c '%a' "/var/lib/private/$(dropin_value StateDirectory "$name")")
        socket_mode=$((8#${socket_info%% *}))
        [[ $dir_info == "750 $group" && $state_mode == 700 ]] \
            && (( (socket_mode & 8#060) == 8#060 && (socket_mode & 8#007) == 0 )) && [[ ${socket_info#* } == "$group" ]] \
            || fail "$unit@$name: its runtime directory is '$dir_info' (expected 750 $group), its command socket '$socket_info' (rw for $group only), its state directory $state_mode (700)"
    done
    as lsmember "${T[@]}" dispatch "$store" "$action" --repeat 100 --json "${both[@]}" >"$run/pair.out" \
        || fail "100 dispatches given both daemons exited $? after $(acks "$run/pair.out") acknowledgements"
    (($(acks "$run/pair.out") == 100)) || fail "100 dispatches given both daemons got $(acks "$run/pair.out") acknowledgements"
    expected=$((expected + 100))
    pair_store "after the first dispatches"
    ((seq == expected)) || fail "after 100 dispatches the store is at seq $seq, expected $expected"
    pass "pair: $unit@a leads (term $term; STATUS=$(uprop a StatusText)), $unit@b active as a standby (systemctl status: Status: \"standby, leader a term $term\"); each with its own /run/$(dropin_value RuntimeDirectory a) and …-b (750, group $group) and state directory (700); '$tool_name stats' given both shows one of each; 100 dispatches given both acknowledged ($(since "$phase") s)"

    # --- The takeover: the leader killed under load. ---
    phase=$(now)
    # A client service following both daemons (its replica logs each move), and the tool dispatching through it.
    ct systemd-run --quiet --unit=lockstep-client -p DynamicUser=yes -p SupplementaryGroups="$group" \
        "${T[@]}" demo-client --stores "$store" --actions 2000 --concurrency 2 --report-ms 500 --timeout-ms 1000 \
        --retries 30 --log-level notice \
        --command-endpoint "$a_cmd" --events-endpoint "${a_cmd%/command}/events" \
        --command-endpoint "$b_cmd" --events-endpoint "${b_cmd%/command}/events" \
        || fail "starting the demo-client service exited $?"
    diag_units+=(lockstep-client)
    as_bg lsmember "$run/takeover.out" "$run/takeover.err" "${T[@]}" dispatch "$store" "$action" --repeat 3000 --json \
        --timeout-ms 1000 --retries 30 "${both[@]}"
    local client=$!
    deadline=$((SECONDS + 30))
    until pair_store "before the kill" && ((seq > expected + 300)); do
        ((SECONDS < deadline)) || fail "the clients' dispatches did not reach seq $((expected + 300)) within 30 s"
        sleep 0.1
    done
    local a_pid before_kill=$seq
    a_pid=$(uprop a MainPID)
    ct systemctl kill --kill-who=main -s KILL "$unit@a.service" || fail "systemctl kill -s KILL $unit@a exited $?"
    killed=$(now)
    deadline=$((SECONDS + 10))
    until [[ $(uprop b StatusText) == "serving "*", leader b term "* ]]; do
        ((SECONDS < deadline)) || fail "10 s after the leader's kill, $unit@b says '$(uprop b StatusText)'"
        sleep 0.05
    done
    took=$(since "$killed")
    awk -v t="$took" 'BEGIN { exit !(t <= 5.0) }' \
        || fail "$unit@b took over ${took} s after the leader's kill, over the 5 s the pair promises (lease 3 s)"
    [[ -n $(ulog_grep b "took the journal's lease: leading") ]] \
        || fail "$unit@b serves, but its log has no \"took the journal's lease: leading\""
    pair_store "at once after the takeover"
    ((seq < expected + 5000)) || fail "the clients had finished (seq $seq) before $unit@b took over: nothing ran through it"
    local through=$((expected + 5000 - seq))
    # systemd restarts the killed instance (Restart=on-failure, RestartSec=1s); it finds b's lease and stands by.
    deadline=$((SECONDS + 20))
    until [[ $(uprop a NRestarts) -ge 1 && $(uprop a ActiveState) == active && $(uprop a StatusText) == "standby, leader b term "* ]]; do
        ((SECONDS < deadline)) || fail "20 s after the kill, $unit@a is $(uprop a ActiveState), NRestarts $(uprop a NRestarts), '$(uprop a StatusText)'"
        sleep 0.2
    done
    new_pid=$(uprop a MainPID)
    [[ $new_pid != "$a_pid" && $new_pid != 0 ]] || fail "after the restart $unit@a has MainPID $new_pid (was $a_pid)"
    [[ $(uprop b StatusText) =~ leader\ b\ term\ ([0-9]+)$ ]] && ((BASH_REMATCH[1] == term + 1)) \
        || fail "$unit@b leads with '$(uprop b StatusText)', expected term $((term + 1))"
    term=$((term + 1))
    stats=$(as lsmember "${T[@]}" stats "${both[@]}" --retries 0 --timeout-ms 5000) \
        || fail "'$tool_name stats' given both daemons after the takeover exited $?: $stats"
    grep -qx "role     leader as b (leader b, term $term)" <<<"$stats" \
        && grep -qx "role     standby as a (leader b, term $term)" <<<"$stats" \
        || fail "after the takeover '$tool_name stats' does not show b leading and a standing by: $stats"
    reap "$client"
    ((status == 0)) || fail "the tool dispatching through the takeover exited $status after $(acks "$run/takeover.out") acknowledgements: $(tail -n 3 "$run/takeover.err")"
    (($(acks "$run/takeover.out") == 3000)) || fail "the tool got $(acks "$run/takeover.out") acknowledgements of 3000"
    expected=$((expected + 3000))
    # The demo-client has answered every dispatch once its report says done; its final report comes at the stop.
    local report
    deadline=$((SECONDS + 60))
    until report=$(ct journalctl -u lockstep-client.service -o cat --no-pager | grep '"done":true' | tail -n 1) && [[ -n $report ]]; do
        ((SECONDS < deadline)) || fail "the demo-client had not answered its 2000 dispatches 60 s after the kill"
        sleep 0.2
    done
    ct systemctl stop lockstep-client.service || fail "systemctl stop lockstep-client exited $?"
    deadline=$((SECONDS + 10))
    until report=$(ct journalctl -u lockstep-client.service -o cat --no-pager | grep '"final":true' | tail -n 1) && [[ -n $report ]]; do
        ((SECONDS < deadline)) || fail "no final report in the demo-client's log 10 s after its stop"
        sleep 0.2
    done
    local accepted failed divergences resyncs replica_seq
    accepted=$(field accepted <<<"$report")
    failed=$(field failed <<<"$report")
    divergences=$(field divergences <<<"$report")
    resyncs=$(field resyncs <<<"$report")
    replica_seq=$(field seq <<<"$report")
    [[ $accepted == 2000 && $failed == 0 && $divergences == 0 ]] \
        || fail "the demo-client's final report: accepted ${accepted:-?} of 2000, failed ${failed:-?}, divergences ${divergences:-?}: ${report:-none}"
    expected=$((expected + accepted))
    ((replica_seq == expected)) \
        || fail "the demo-client's replica ended at seq ${replica_seq:-?}, the store's acknowledged dispatches make $expected: ${report}"
    # Dispatches go on, to b, through the tool given both.
    as lsmember "${T[@]}" dispatch "$store" "$action" --repeat 100 --json "${both[@]}" >"$run/after.out" \
        || fail "100 dispatches given both daemons after the takeover exited $?"
    (($(acks "$run/after.out") == 100)) || fail "100 dispatches after the takeover got $(acks "$run/after.out") acknowledgements"
    expected=$((expected + 100))
    pass "takeover: $unit@a (leader, pid $a_pid) killed with SIGKILL under load (the store past seq $before_kill); $unit@b serving ${took} s later (STATUS=$(uprop b StatusText)), logged \"took the journal's lease: leading\"; systemd restarted a (pid $new_pid, NRestarts $(uprop a NRestarts)), a standby of b; the tool's 3000 and the demo-client service's 2000 dispatches ($through of them answered by b) all acknowledged (its replica at seq $replica_seq, $divergences divergences, $resyncs resyncs), 100 more after ($(since "$phase") s)"
    pair_excerpts

    # --- The journal: every acknowledged dispatch once. ---
    phase=$(now)
    pair_store "at the end"
    ((seq == expected)) || fail "the store is at seq $seq; the acknowledged dispatches make $expected"
    local rows
    rows=$(psql_admin -d lockstep -c "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM lockstep.events WHERE store = '$store'")
    [[ $rows == "$expected|$expected|1|$expected" ]] \
        || fail "the journal's events of $store: count, distinct seqs, first, last = '$rows', expected $expected|$expected|1|$expected"
    ct env PGPASSFILE=/etc/lockstep/pgpass "${T[@]}" journal verify --postgres "$pg_conninfo" >"$run/verify.out" 2>&1 \
        || fail "'$tool_name journal verify --postgres' exited $?: $(cat "$run/verify.out")"
    pass "journal: $store at seq $seq = the $expected acknowledged dispatches, $expected event rows with seqs 1…$expected each once; '$tool_name journal verify --postgres' finds it intact ($(since "$phase") s)"

    # --- Stop both; what the logs say. ---
    phase=$(now)
    ct systemctl stop "$unit@a.service" "$unit@b.service" || fail "systemctl stop of both exited $?"
    for name in "${pair_names[@]}"; do
        local result
        result="$(uprop "$name" ActiveState) $(uprop "$name" Result) $(uprop "$name" ExecMainStatus)"
        [[ $result == "inactive success 0" ]] || fail "after systemctl stop, $unit@$name: $result, expected inactive success 0"
    done
    local both_logs bad kills
    both_logs=$(ulog a; ulog b)
    bad=$(grep -E 'SIGSYS|status=31/SYS|Bad system call|Operation not permitted|EPERM|errno=1([^0-9]|$)|\(src/[a-z_]+\.[ch]pp:[0-9]+\)' <<<"$both_logs" || true)
    [[ -z $bad ]] || fail "the logs of the pair show refused calls or assertions: $bad"
    kills=$(grep -E 'Main process exited, code=(killed|dumped)' <<<"$both_logs" || true)
    [[ $(grep -c . <<<"$kills") == 1 && $kills == *"$unit@a.service"*status=9/KILL* ]] \
        || fail "expected one kill, the test's SIGKILL of $unit@a; the logs have: ${kills:-none}"
    pass "stop: both exit 0; no SIGSYS, EPERM or assertion in $(grep -c . <<<"$both_logs") lines of their logs; the only kill was the test's ($(since "$phase") s)"
}

# The store's seq as the leader reports it (`lockstep state` given both daemons goes to the leader).
pair_store() {
    ct_out=$(as lsmember "${T[@]}" state "$store" --json "${both[@]}" --retries 2 --timeout-ms 2000) \
        || fail "'$tool_name state $store' given both daemons exited $? ($1)"
    seq=$(field seq <<<"$ct_out")
}

# The takeover as the logs tell it: the killed leader, the standby that took over, the client service.
pair_excerpts() {
    local line
    say "the takeover in journalctl -u $unit@a, $unit@b and lockstep-client (trimmed):"
    { ulog_grep a "status=9/KILL|Scheduled restart|another daemon leads" | head -n 4 | sed "s/^/  a| /"
      ulog_grep b "took the journal's lease" | head -n 2 | sed "s/^/  b| /"
      ulog_grep lockstep-client "sending to another daemon|no word from" | head -n 3 | sed "s/^/  client| /"
    } | while IFS= read -r line; do echo "${line:0:300}"; done
}
