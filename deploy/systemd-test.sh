#!/usr/bin/env bash
# A daemon's systemd unit under a real systemd. Boots a Debian root with systemd-nspawn, installs the unit from
# deploy/ (or the template's) with the daemon and its tool, and checks what docs/operations.md ("### systemd")
# promises: READY=1 only after recovery, the client group gets in and nobody else, every filter holds through
# load, snapshots, compaction, a tcp bind and a SIGHUP reload, the watchdog restarts a stopped daemon, and stop
# and restart lose nothing acknowledged. With --pair: two instances of deploy/lockstepd.service (as the template
# lockstepd@.service, with deploy/lockstepd@.service.d/instance.conf) on one PostgreSQL journal, a leader and a
# standby; the leader killed, the standby takes over and the killed one comes back as a standby
# (deploy/systemd-test-pair.sh says what it checks).
#
#   bash deploy/systemd-test.sh          # deploy/lockstepd.service, lockstepd and lockstep, the counter store
#   bash deploy/systemd-test.sh --pair   # lockstepd@a and lockstepd@b on the container's PostgreSQL
#   bash deploy/systemd-test.sh --unit docs/tutorial/deploy/boardd.service --daemon BIN/boardd --tool BIN/board \
#       --store board --setup ACTION [--setup ACTION…] --action ACTION
#
# --setup actions are dispatched once, as one batch, before the checks; --action must be accepted every time
# (it is dispatched a few thousand times). The binaries default to $(swift build --show-bin-path)/lockstepd and
# lockstep; LOCKSTEPD and LOCKSTEP override them.
#
# Needs root, unshare, systemd-nspawn and debootstrap (apt-get installs the last two when they are missing). The
# Debian root is built once (a minute or two) into .build-nspawn/root and reused; every run boots it under an
# overlay of its own, so no run sees another's users, journal or logs. Where nspawn cannot run (not root, no mount
# namespaces, nothing to install the tools with) it prints SKIP and exits 0; SYSTEMD_TEST_REQUIRED=1 makes that a
# failure. SYSTEMD_TEST_MIRROR overrides the Debian mirror (default: the one apt uses). Every wait is bounded; the
# container is powered off and its files removed on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# Seconds since $1 (a `now`), to a tenth.
now() { echo "${EPOCHREALTIME:-$SECONDS}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
started=$(now)

usage="usage: systemd-test.sh [--pair] [--unit FILE] [--daemon BIN] [--tool BIN] [--store NAME] [--setup ACTION]... [--action ACTION]"
unit_file=deploy/lockstepd.service
daemon=${LOCKSTEPD:-}
tool=${LOCKSTEP:-}
store=counter
setup=()
action='{"increment":{}}'
pair=0
while (($#)); do
    [[ $1 == -h || $1 == --help ]] && { echo "$usage"; exit 0; }
    [[ $1 == --pair ]] && { pair=1; shift; continue; }
    (($# >= 2)) || { echo "systemd-test: $1 needs a value; $usage" >&2; exit 64; }
    case $1 in
        --unit) unit_file=$2 ;;
        --daemon) daemon=$2 ;;
        --tool) tool=$2 ;;
        --store) store=$2 ;;
        --setup) setup+=("$2") ;;
        --action) action=$2 ;;
        *) echo "systemd-test: unknown option $1; $usage" >&2; exit 64 ;;
    esac
    shift 2
done
[[ -f $unit_file ]] || { echo "systemd-test: no unit file $unit_file" >&2; exit 64; }
unit=$(basename "$unit_file" .service)
label=$unit
if ((pair)); then
    # The pair runs lockstepd's own unit and tool (its demo-client follows the takeover).
    [[ $unit_file == deploy/lockstepd.service && $store == counter && ${#setup[@]} == 0 ]] \
        || { echo "systemd-test: --pair runs deploy/lockstepd.service on the counter store; give no --unit, --store or --setup" >&2; exit 64; }
    label="$unit pair"
    source deploy/systemd-test-pair.sh
fi
run=""
nspawn_pid=""
sd_pid=""
bg_pids=()

say() { echo "systemd-test[$label]: $*"; }
pass() { echo "systemd-test[$label]: PASS $*"; }
skip() {
    if [[ ${SYSTEMD_TEST_REQUIRED:-0} == 1 ]]; then fail "cannot run, and SYSTEMD_TEST_REQUIRED=1: $*"; fi
    echo "systemd-test[$label]: SKIP: $* -- $unit_file was NOT run under systemd"
    exit 0
}
fail() {
    echo "systemd-test[$label]: FAIL: $*" >&2
    diagnostics >&2 || true
    exit 1
}
# What a failure prints after its reason: the units' status and log, the clients' errors, or how nspawn ended.
diag_units=()  # the units to show; the unit under test when empty
diagnostics() {
    [[ -n $sd_pid ]] && kill -0 "$sd_pid" 2>/dev/null || { [[ -f $run/nspawn.log ]] && tail -n 20 "$run/nspawn.log"; return 0; }
    local shown units=(${diag_units[@]+"${diag_units[@]}"})
    ((${#units[@]})) || units=("$unit")
    for shown in "${units[@]}"; do
        echo "--- systemctl status $shown:"
        ct systemctl status --no-pager --lines=0 "$shown.service" 2>&1 | head -n 12
        echo "--- the last 30 lines of journalctl -u $shown:"
        ct journalctl -u "$shown.service" --no-pager -o short-monotonic 2>&1 | tail -n 30
    done
    for file in "$run"/*.err; do
        [[ -s $file ]] && { echo "--- $(basename "$file"):"; tail -n 5 "$file"; }
    done
    return 0
}

# What the unit says: where the daemon goes, the group clients join, the directories systemd makes for it.
unit_value() { sed -n "s/^$1=//p" "$unit_file" | tail -n 1; }
daemon_path=$(unit_value ExecStart | awk '{print $1}')
group=$(unit_value Group)
runtime_dir=/run/$(unit_value RuntimeDirectory | awk '{print $1}')
state_dir=/var/lib/$(unit_value StateDirectory | awk '{print $1}')
[[ $daemon_path == /* ]] || { echo "systemd-test: $unit_file has no absolute ExecStart= path" >&2; exit 64; }
[[ -n $group ]] || {
    echo "systemd-test: $unit_file sets no Group=: no process but the daemon's own could reach $runtime_dir" >&2
    exit 1
}
[[ $runtime_dir != /run/ && $state_dir != /var/lib/ ]] || {
    echo "systemd-test: $unit_file needs RuntimeDirectory= and StateDirectory=" >&2
    exit 64
}

# --- Can nspawn run here? Anything missing is a SKIP with the reason, never a silent pass. ---
[[ $(uname -s) == Linux ]] || skip "systemd-nspawn needs Linux, this is $(uname -s)"
((EUID == 0)) || skip "needs root (unshare, mounts, systemd-nspawn); run it as root: sudo make systemd"

if [[ -z $daemon || -z $tool ]]; then
    command -v swift >/dev/null || fail "no swift on PATH to find the binaries; set LOCKSTEPD and LOCKSTEP"
    bin=$(swift build --show-bin-path) || fail "'swift build --show-bin-path' failed"
    daemon=${daemon:-$bin/lockstepd}
    tool=${tool:-$bin/lockstep}
fi
[[ -x $daemon ]] || fail "no daemon binary at $daemon; build it first (make build, or make template)"
[[ -x $tool ]] || fail "no tool binary at $tool; build it first (make build, or make template)"
tool_name=$(basename "$tool")

export DEBIAN_FRONTEND=noninteractive
cache=$repo/.build-nspawn
mkdir -p "$cache"
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v pgrep >/dev/null || missing+=(procps)
for exe in unshare nsenter flock setpriv; do command -v $exe >/dev/null || { missing+=(util-linux); break; }; done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null || skip "${missing[*]} missing, and no apt-get to install them"
    say "installing ${missing[*]} with apt-get"
    # A stale package list is the usual reason an install fails: update once, then try again.
    apt-get install -y -qq "${missing[@]}" >"$cache/apt.log" 2>&1 \
        || { apt-get update -qq >>"$cache/apt.log" 2>&1 && apt-get install -y -qq "${missing[@]}" >>"$cache/apt.log" 2>&1; } \
        || skip "apt-get could not install ${missing[*]}: $(tail -n 2 "$cache/apt.log" | tr '\n' ' ')"
fi
unshare --mount --propagation private true 2>/dev/null \
    || skip "unshare --mount fails here (no CAP_SYS_ADMIN, or mount namespaces are not allowed)"
unshare --mount --propagation private sh -c 'mount -t cgroup2 cgroup2 /sys/fs/cgroup' 2>/dev/null \
    || skip "cannot mount cgroup2 in a mount namespace, which the container's systemd needs"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || grep -qw overlay /proc/filesystems \
    || skip "no overlay file system in this kernel"

# One run at a time per checkout: the root is built and the run folders cleared under this lock.
exec 9>"$cache/lock"
flock -w 900 9 || fail "another systemd-test held $cache/lock for 15 min"
# Folders of a run that could not clean up (killed with SIGKILL): nothing uses them while we hold the lock.
rm -rf "$cache"/run.*

# --- The Debian root, built once and reused. ---
suite=${SYSTEMD_TEST_SUITE:-bookworm}
# systemd and dbus to boot, libzmq5 and libsqlite3-0 for the binaries (their Swift runtime is copied in below),
# libpq5 (which lockstepd opens for a PostgreSQL journal) and postgresql for --pair. The package starts its cluster at
# boot; that link is removed from the root, so only --pair, which starts it, pays for it.
packages=systemd,systemd-sysv,dbus,libzmq5,libsqlite3-0,libpq5,postgresql
root=$cache/root
stamp="$suite --variant=minbase --include=$packages, postgresql not started at boot"
find_mirror() {
    [[ -n ${SYSTEMD_TEST_MIRROR:-} ]] && { echo "$SYSTEMD_TEST_MIRROR"; return; }
    local uri
    # One-line sources: deb [options] URI SUITE COMPONENT…
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v s="$suite" '
        $1 == "deb" { for (i = 2; i < NF; i++) if ($i ~ /^[a-z+]+:\/\//) { if ($(i + 1) == s) { print $i; exit } ; break } }')
    # deb822 sources: a stanza with URIs: and a Suites: that names the suite.
    [[ -n $uri ]] || uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$suite" '
        BEGIN { RS = ""; FS = "\n" }
        { u = ""; ok = 0
          for (i = 1; i <= NF; i++) {
              if ($i ~ /^URIs:/) { split($i, a, " "); u = a[2] }
              if ($i ~ /^Suites:/) { n = split($i, b, " "); for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 }
          }
          if (ok && u != "") { print u; exit } }')
    echo "${uri:-http://deb.debian.org/debian}"
}
if [[ ! -f $cache/root.done || $(cat "$cache/root.done") != "$stamp" ]]; then
    mirror=$(find_mirror)
    say "building the Debian root once: debootstrap $stamp $root $mirror (a minute or two)"
    rm -rf "$root" "$cache/root.new" "$cache/root.done"
    root_started=$SECONDS
    timeout 900 debootstrap --variant=minbase --include="$packages" "$suite" "$cache/root.new" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 \
        || skip "debootstrap of $suite from $mirror failed (log: $cache/debootstrap.log): $(tail -n 2 "$cache/debootstrap.log" | tr '\n' ' ')"
    rm -f "$cache/root.new/etc/systemd/system/multi-user.target.wants/postgresql.service"
    mv "$cache/root.new" "$root"
    echo "$stamp" >"$cache/root.done"
    say "built the root in $((SECONDS - root_started)) s; later runs reuse it"
fi

# --- This run: an overlay over the root, its upper layer holding what the run installs. ---
run=$(mktemp -d "$cache/run.XXXXXX")
upper=$run/upper
mkdir -p "$upper" "$run/work" "$run/merged"
cleanup() {
    local status=$?
    trap - EXIT
    set +e
    # A background client is nsenter on this side and, in the container, its child `timeout`, which leads a process
    # group with the client. Killing nsenter alone would leave the client to hold up the container's halt.
    for pid in ${bg_pids[@]+"${bg_pids[@]}"}; do
        for child in $(pgrep -P "$pid"); do kill -KILL -- "-$child" 2>/dev/null || kill -KILL "$child" 2>/dev/null; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null # reaped quietly: bash would report the kill
    done
    if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
        # SIGTERM makes nspawn halt the container cleanly; if it does not within 20 s, SIGKILL its init (which
        # takes every process of the container with it) and nspawn.
        kill -TERM "$nspawn_pid" 2>/dev/null || true
        local deadline=$((SECONDS + 20))
        while kill -0 "$nspawn_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$nspawn_pid" 2>/dev/null; then
            echo "systemd-test[$unit]: the container did not halt within 20 s; killing it" >&2
            [[ -n $sd_pid ]] && kill -KILL "$sd_pid" 2>/dev/null
            kill -KILL "$nspawn_pid" 2>/dev/null
        fi
    fi
    [[ -n $nspawn_pid ]] && wait "$nspawn_pid" 2>/dev/null
    # The overlay and tmpfs mounts lived in nspawn's own mount namespace and went with it.
    rm -rf "$run" || echo "systemd-test[$unit]: could not remove $run" >&2
    exit "$status"
}
trap cleanup EXIT
trap 'echo "systemd-test[$unit]: interrupted; cleaning up" >&2; exit 130' INT TERM HUP

# The binaries at the unit's paths, and the Swift runtime they link (ldd: whatever is not a system library).
install -D -m 0755 "$daemon" "$upper$daemon_path"
install -D -m 0755 "$tool" "$upper/usr/local/bin/$tool_name"
mkdir -p "$upper/usr/local/lib/lockstep" "$upper/etc/ld.so.conf.d"
for binary in "$daemon" "$tool"; do
    libs=$(ldd "$binary") || fail "ldd $binary exited $?"
    [[ $libs != *"not found"* ]] || fail "ldd $binary on this host: $(grep 'not found' <<<"$libs" | tr -s ' \t\n' ' ')"
    for lib in $(awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$libs"); do
        case $lib in /lib/* | /lib64/* | /usr/lib/*) continue ;; esac
        cp -L "$lib" "$upper/usr/local/lib/lockstep/"
    done
done
echo /usr/local/lib/lockstep >"$upper/etc/ld.so.conf.d/lockstep.conf"

if ((pair)); then
    pair_install
else
    # The unit exactly as shipped, and a drop-in with what only this test changes.
    install -D -m 0644 "$unit_file" "$upper/etc/systemd/system/$unit.service"
    test_dir=/etc/lockstep-test
    mkdir -p "$upper/etc/systemd/system/$unit.service.d" "$upper$test_dir"
    cat >"$upper/etc/systemd/system/$unit.service.d/systemd-test.conf" <<EOF
# deploy/systemd-test.sh only.
[Service]
# The unit's 10 s watchdog shortened, so that the SIGSTOP check takes seconds.
WatchdogSec=3s
# A refused system call kills the daemon with SIGSYS rather than failing with EPERM: a library that handles the
# EPERM quietly would hide a call the filter refuses.
SystemCallErrorNumber=kill
# A snapshot every 50 events, and events on tcp with CURVE, so that snapshots, compaction, a tcp bind and the
# SIGHUP reload of the clients list all run under the filters. The secret key comes as a credential: the daemon's
# user is dynamic, so no file could be made its own in advance.
ExecStart=
ExecStart=$daemon_path --config $test_dir/daemon.toml
LoadCredential=server.key:$test_dir/server.key
EOF
    events_port=7411
    cat >"$upper$test_dir/daemon.toml" <<EOF
# deploy/systemd-test.sh only (see the unit's systemd-test.conf drop-in).
events_endpoint = "tcp://127.0.0.1:$events_port"

[snapshots]
every_events = 50
keep = 2

[curve]
server_key_file = "/run/credentials/$unit.service/server.key"
allowed_clients_file = "$test_dir/clients"
EOF
    for name in server client1 client2; do
        "$tool" keygen --out "$upper$test_dir/$name" >/dev/null || fail "'$tool_name keygen --out $name' exited $?"
    done
    cp "$upper$test_dir/client1.pub" "$upper$test_dir/clients"
fi

# --- Boot. ---
machine=lockstep-test-$$
# In a mount namespace of its own: a tmpfs on /run keeps nspawn's lock and propagation folders off the host, cgroup2
# on /sys/fs/cgroup is what the container's systemd runs on, and the overlay keeps the cached root untouched.
boot='set -e
run=$1 root=$2 machine=$3
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t overlay overlay -o "lowerdir=$root,upperdir=$run/upper,workdir=$run/work" "$run/merged"
ldconfig -r "$run/merged"
exec systemd-nspawn --quiet --boot --directory="$run/merged" --machine="$machine" --register=no --keep-unit \
    --console=passive --private-network --link-journal=no --resolv-conf=off --timezone=off'
boot_started=$(now)
unshare --mount --propagation private bash -c "$boot" bash "$run" "$root" "$machine" >"$run/nspawn.log" 2>&1 &
nspawn_pid=$!

deadline=$((SECONDS + 20))
until sd_pid=$(pgrep -P "$nspawn_pid" -x systemd); do
    kill -0 "$nspawn_pid" 2>/dev/null || fail "systemd-nspawn exited before the container's systemd ran: $(tail -n 5 "$run/nspawn.log")"
    ((SECONDS < deadline)) || fail "no systemd under systemd-nspawn (pid $nspawn_pid) after 20 s"
    sleep 0.1
done

# Commands in the container: every namespace of its systemd, a clean environment, and a time limit inside (the
# command is killed there) and outside (nsenter itself).
ct_env=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
limit=30
ct() { timeout -k 5 $((limit + 10)) nsenter -t "$sd_pid" -a "${ct_env[@]}" timeout -k 2 "$limit" "$@"; }
# As a user of the container, with that user's groups.
as() { local user=$1; shift; ct setpriv --reuid="$user" --regid="$user" --init-groups "$@"; }
# In the background, as a user; stdout and stderr to files; the PID goes into bg_pids (for the cleanup) and $!.
as_bg() {
    local user=$1 out=$2 err=$3; shift 3
    nsenter -t "$sd_pid" -a "${ct_env[@]}" timeout -k 2 180 setpriv --reuid="$user" --regid="$user" --init-groups \
        "$@" >"$out" 2>"$err" &
    bg_pids+=($!)
}
prop() { ct systemctl show -p "$1" --value "$unit.service"; }
unit_log() { ct journalctl -u "$unit.service" --no-pager -o short-monotonic; }
# Whether the unit's log has a line matching $1. (Not `unit_log | grep -q`: with pipefail, grep leaving early would
# make journalctl's SIGPIPE count as no match.)
log_has() { local log; log=$(unit_log); grep -qE -- "$1" <<<"$log"; }
# Waits for background process $1 (started with as_bg) and takes it off the cleanup's list; sets `status`.
reap() {
    local pid=$1 kept=() other
    status=0
    wait "$pid" || status=$?
    for other in ${bg_pids[@]+"${bg_pids[@]}"}; do [[ $other == "$pid" ]] || kept+=("$other"); done
    bg_pids=(${kept[@]+"${kept[@]}"})
}

# systemctl cannot connect until systemd has made its private socket, and says 'offline' while the container's
# PID 1 is not yet systemd's manager; after that, --wait waits out the boot.
deadline=$((SECONDS + 60))
while waited=$(limit=60 ct systemctl is-system-running --wait 2>&1) || true
    [[ $waited == *"Failed to connect"* || $waited == offline ]]
do
    ((SECONDS < deadline)) || break
    sleep 0.1
done
case $waited in
    running) ;;
    degraded) say "note: the container booted degraded: $(ct systemctl --failed --no-legend --plain | awk '{print $1}' | tr '\n' ' ')" ;;
    *) fail "the container's systemd is '$waited' after 60 s, not running" ;;
esac
pass "booted $suite with systemd $(ct systemctl --version | awk 'NR == 1 {print $2}') under systemd-nspawn in $(since "$boot_started") s"

for binary in "$daemon_path" "/usr/local/bin/$tool_name"; do
    libs=$(ct ldd "$binary") || fail "in the container, ldd $binary exited $?"
    [[ $libs != *"not found"* ]] \
        || fail "in the container, ldd $binary: $(grep 'not found' <<<"$libs" | tr -s ' \t\n' ' ') (add the package to \$packages)"
done

# The filters are enforced in this container: a call they refuse kills a control unit with SIGSYS. Without this, "no
# SIGSYS" below could mean that seccomp was not applied at all.
ct systemd-run --quiet --unit=systemd-test-seccomp-control -p SystemCallFilter=@system-service \
    -p 'SystemCallFilter=~@resources' -p SystemCallErrorNumber=kill /usr/bin/nice -n 1 true || true
deadline=$((SECONDS + 10))
until [[ $(ct systemctl show -p Result --value systemd-test-seccomp-control) != success ]]; do
    ((SECONDS < deadline)) || break
    sleep 0.1
done
control="$(ct systemctl show -p Result --value systemd-test-seccomp-control) $(ct systemctl show -p ExecMainStatus --value systemd-test-seccomp-control)"
[[ $control == "signal 31" ]] || fail "a control unit whose filter refuses setpriority ended '$control', not 'signal 31' (SIGSYS): seccomp filters are not enforced here"
# 2147483646 is how systemd shows SystemCallErrorNumber=kill: the drop-in is in force.
[[ $(prop SystemCallErrorNumber) == 2147483646 ]] \
    || fail "$unit has SystemCallErrorNumber=$(prop SystemCallErrorNumber); the drop-in's 'kill' is not in force"
pass "seccomp is enforced here (a control unit calling a refused setpriority died of SIGSYS)"

# --- The admin's part: the group the unit names, a member and an outsider. ---
# The group must exist before the start: with DynamicUser=yes, systemd would otherwise allocate a dynamic group of
# that name that lives only while the daemon runs, which no user can be added to.
if ! ct getent group "$group" >/dev/null; then ct groupadd --system "$group"; fi
ct useradd --system --no-create-home --shell /usr/sbin/nologin --groups "$group" lsmember
ct useradd --system --no-create-home --shell /usr/sbin/nologin lsoutsider

endpoint=ipc://$runtime_dir/command
T=("/usr/local/bin/$tool_name")
# The field (a number or hex digits) of the first JSON object on stdin that has it.
field() { grep -o -m1 -E "\"$1\":\"?[0-9a-f]+" | head -n 1 | sed -E 's/.*:"?//'; }
acks() { grep -c '"seq":' "$1" || true; }
# The store's seq and epoch, as the daemon reports them: one try (the daemon must be serving), 5 s for a loaded machine.
read_store() {
    ct_out=$(as lsmember "${T[@]}" state "$store" --json --command-endpoint "$endpoint" --retries 0 --timeout-ms 5000) \
        || fail "'$tool_name state $store' as lsmember exited $? ($1)"
    seq=$(field seq <<<"$ct_out")
    epoch=$(field epoch <<<"$ct_out")
}
expected=0  # the store's seq: every action acknowledged so far, each applied exactly once

if ((pair)); then
    pair_run
    say "all checks passed in $(since "$started") s"
    exit 0
fi

# --- Start: active only once the daemon has recovered and bound its sockets. ---
phase=$(now)
ct systemctl start "$unit.service" || fail "systemctl start $unit exited $?"
[[ $(prop ActiveState) == active ]] || fail "after systemctl start, $unit is $(prop ActiveState), not active"
ct test -S "$runtime_dir/command" || fail "$unit is active but $runtime_dir/command is not a socket"
as lsmember "${T[@]}" stats --command-endpoint "$endpoint" --retries 0 --timeout-ms 5000 >/dev/null \
    || fail "$unit is active but '$tool_name stats' as a member of $group got no answer"
dir_info=$(ct stat -c '%a %G %u' "$runtime_dir")
socket_info=$(ct stat -c '%a %G' "$runtime_dir/command")
[[ ${dir_info% *} == "750 $group" ]] || fail "$runtime_dir is '$dir_info' (mode group owner), not 750 $group"
# A socket's x bits mean nothing; what counts is rw for the group and nothing for others.
socket_mode=$((8#${socket_info%% *}))
(( (socket_mode & 8#060) == 8#060 && (socket_mode & 8#007) == 0 )) \
    && [[ ${socket_info#* } == "$group" ]] || fail "$runtime_dir/command is '$socket_info', not rw for $group only"
main_pid=$(prop MainPID)
pass "start: active when systemctl start returned, sockets bound and '$tool_name stats' answered at once; $runtime_dir is ${dir_info% *} (owner: dynamic uid ${dir_info##* }), the socket ${socket_info} ($(since "$phase") s)"

# --- Who gets in. ---
phase=$(now)
if ((${#setup[@]})); then
    as lsmember "${T[@]}" dispatch "$store" "${setup[@]}" --json --command-endpoint "$endpoint" >"$run/setup.out" \
        || fail "the setup batch (${setup[*]}) exited $?"
    expected=$((expected + ${#setup[@]}))
fi
as lsmember "${T[@]}" dispatch "$store" "$action" --json --command-endpoint "$endpoint" >"$run/member.out" \
    || fail "a dispatch as lsmember (in group $group) exited $?"
expected=$((expected + 1))
read_store "after the member's dispatch"
((seq == expected)) || fail "after the member's dispatch the store is at seq $seq, expected $expected"
ct systemd-run --quiet --wait --pipe -p DynamicUser=yes -p SupplementaryGroups="$group" \
    "${T[@]}" dispatch "$store" "$action" --json --command-endpoint "$endpoint" >"$run/service.out" \
    || fail "a client service with DynamicUser=yes and SupplementaryGroups=$group exited $?"
expected=$((expected + 1))
outsider_status=0
as lsoutsider "${T[@]}" dispatch "$store" "$action" --command-endpoint "$endpoint" >/dev/null 2>"$run/outsider.err" \
    || outsider_status=$?
((outsider_status != 0)) || fail "lsoutsider (not in $group) dispatched"
((outsider_status == 1)) || fail "lsoutsider was refused with exit $outsider_status, not 1: $(cat "$run/outsider.err")"
grep -q 'permission denied' "$run/outsider.err" \
    || fail "lsoutsider was refused with exit $outsider_status but not told why: $(cat "$run/outsider.err")"
outsider_said=$(cat "$run/outsider.err")
status=0
ct systemd-run --quiet --wait --pipe -p DynamicUser=yes "${T[@]}" dispatch "$store" "$action" \
    --command-endpoint "$endpoint" >/dev/null 2>"$run/outsider-service.err" || status=$?
((status != 0)) && grep -q 'permission denied' "$run/outsider-service.err" \
    || fail "a DynamicUser client service outside $group: exit $status, '$(cat "$run/outsider-service.err")'"
read_store "after the refused dispatches"
((seq == expected)) || fail "after the refused dispatches the store is at seq $seq, expected $expected"
pass "access: a user in $group and a service with SupplementaryGroups=$group dispatch; a user and a service outside it are refused by the file system (exit $outsider_status): '$outsider_said' ($(since "$phase") s)"

# --- Under every filter: load, snapshots and compaction, a tcp bind with CURVE, a SIGHUP reload. ---
phase=$(now)
as lsmember "${T[@]}" dispatch "$store" "$action" --repeat 300 --json --command-endpoint "$endpoint" >"$run/load.out" \
    || fail "300 dispatches as lsmember: exit $? after $(acks "$run/load.out") acknowledgements"
(($(acks "$run/load.out") == 300)) || fail "300 dispatches got $(acks "$run/load.out") acknowledgements"
expected=$((expected + 300))
stats=$(ct "${T[@]}" journal stats "$state_dir") || fail "'$tool_name journal stats $state_dir' exited $?"
read -r first_seq last_seq snapshots < <(awk -v s="$store" '$1 == s { print $4, $5, $7 }' <<<"$stats") || true
[[ ${snapshots:--} != - && $first_seq =~ ^[0-9]+$ && $last_seq =~ ^[0-9]+$ ]] && ((first_seq > 1 && last_seq == expected)) \
    || fail "the journal holds $store from seq ${first_seq:-?} to ${last_seq:-?} with snapshots ${snapshots:-none}; expected snapshots and the events below the oldest compacted, up to $expected"
# A subscriber without CURVE gets nothing on tcp, not even a heartbeat.
as_bg lsmember "$run/tail.out" "$run/tail.err" "${T[@]}" tail "$store" --events-endpoint "tcp://127.0.0.1:$events_port" \
    --count 1 --silence-ms 2000
tail_pid=$!
# Its tcp connection to the events port, seen in the container's network namespace (/proc/net/tcp, hex ports):
# established, or already closed (TIME_WAIT on the side that closed first), since the daemon's CURVE handshake
# fails it.
deadline=$((SECONDS + 10))
until ct cat /proc/net/tcp | awk -v port=":$(printf '%04X' "$events_port")" \
    '$3 ~ port "$" || ($2 ~ port "$" && $4 != "0A") { seen = 1 } END { exit !seen }'; do
    ((SECONDS < deadline)) || fail "'$tool_name tail' did not connect to tcp://127.0.0.1:$events_port within 10 s"
    sleep 0.05
done
as lsmember "${T[@]}" dispatch "$store" "$action" --json --command-endpoint "$endpoint" >/dev/null \
    || fail "a dispatch while a tail listened on tcp exited $?"
expected=$((expected + 1))
reap "$tail_pid"
((status != 0)) && [[ ! -s $run/tail.out ]] \
    || fail "'$tool_name tail' without CURVE on tcp://127.0.0.1:$events_port: exit $status, printed '$(cat "$run/tail.out")'"
ct sh -c "cat $test_dir/client2.pub >> $test_dir/clients"
ct systemctl kill -s HUP "$unit.service"
deadline=$((SECONDS + 10))
until log_has 'clients=2 .*reloaded the CURVE clients'; do
    ((SECONDS < deadline)) || fail "no 'reloaded the CURVE clients' with clients=2 in the log 10 s after SIGHUP"
    sleep 0.2
done
[[ $(prop ActiveState) == active && $(prop MainPID) == "$main_pid" && $(prop NRestarts) == 0 ]] \
    || fail "after load and SIGHUP: $(prop ActiveState), MainPID $(prop MainPID) (was $main_pid), NRestarts $(prop NRestarts)"
pass "filters: 300 dispatches in one run (and one more while a tcp subscriber listened), snapshots at seqs $snapshots with the events below $first_seq compacted, tcp bound with CURVE (a subscriber without it heard nothing), SIGHUP reloaded the clients list; still active as pid $main_pid ($(since "$phase") s)"

# --- The watchdog: a stopped daemon is killed and restarted, and keeps everything it acknowledged. ---
phase=$(now)
read_store "before SIGSTOP"
epoch_before=$epoch
restarts_before=$(prop NRestarts)
# A client dispatching through the whole outage: a silent daemon is asked again (same request, fresh socket) every
# second, so each of its dispatches is acknowledged once the daemon is back, and applied once.
as_bg lsmember "$run/watchdog.out" "$run/watchdog.err" "${T[@]}" dispatch "$store" "$action" --repeat 5000 --json \
    --timeout-ms 1000 --retries 30 --command-endpoint "$endpoint"
client=$!
deadline=$((SECONDS + 30))
until read_store "before SIGSTOP" && ((seq > expected + 100)); do
    ((SECONDS < deadline)) || fail "the client's dispatches did not reach seq $((expected + 100)) within 30 s"
    sleep 0.1
done
ct systemctl kill -s STOP "$unit.service"
stopped=$(now)
deadline=$((SECONDS + 30))
until [[ $(prop NRestarts) -gt $restarts_before && $(prop ActiveState) == active ]]; do
    ((SECONDS < deadline)) || fail "30 s after SIGSTOP: $(prop ActiveState), NRestarts $(prop NRestarts) (was $restarts_before)"
    sleep 0.2
done
back=$(since "$stopped")
new_pid=$(prop MainPID)
[[ $new_pid != "$main_pid" && $new_pid != 0 ]] || fail "after the watchdog the MainPID is $new_pid (was $main_pid)"
log_has 'Watchdog timeout' || fail "$unit came back, but the log has no 'Watchdog timeout'"
read_store "at once after the watchdog restart"
((seq < expected + 5000)) || fail "the client had finished (seq $seq) before the daemon came back: nothing ran through the outage"
through=$((expected + 5000 - seq))
reap "$client"
((status == 0)) || fail "the client dispatching through the watchdog restart exited $status after $(acks "$run/watchdog.out") acknowledgements"
(($(acks "$run/watchdog.out") == 5000)) || fail "the client got $(acks "$run/watchdog.out") acknowledgements of 5000"
expected=$((expected + 5000))
read_store "after the watchdog restart"
((seq == expected)) || fail "after the watchdog restart the store is at seq $seq; the acknowledged dispatches make $expected"
[[ $epoch == "$epoch_before" ]] || fail "the store's epoch is $epoch, was $epoch_before: the journal in $state_dir was not kept"
pass "watchdog: SIGSTOP, killed and restarted ${back} s after it (NRestarts $restarts_before -> $(prop NRestarts), pid $main_pid -> $new_pid); all 5000 dispatches of a client running through it ($through of them answered by the new daemon) acknowledged and applied once (seq $seq, epoch $epoch kept) ($(since "$phase") s)"
main_pid=$new_pid

# --- Restart under load: the stop drains, the start recovers, the clients' retries land once. ---
phase=$(now)
log=$(unit_log)
clean_stops=$(grep -c 'Deactivated successfully' <<<"$log" || true)
drains=$(grep -c 'daemon stopping: the last batch is committed' <<<"$log" || true)
restart_clients=()
for n in 1 2; do
    as_bg lsmember "$run/restart$n.out" "$run/restart$n.err" "${T[@]}" dispatch "$store" "$action" --repeat 3000 \
        --json --timeout-ms 1000 --retries 30 --command-endpoint "$endpoint"
    restart_clients+=($!)
done
deadline=$((SECONDS + 30))
until read_store "before the restart" && ((seq > expected + 100)); do
    ((SECONDS < deadline)) || fail "the clients' dispatches did not reach seq $((expected + 100)) within 30 s"
    sleep 0.1
done
ct systemctl restart "$unit.service" || fail "systemctl restart $unit exited $?"
read_store "at once after systemctl restart returned"
((seq < expected + 6000)) || fail "the clients had finished (seq $seq) before the restart: it was not under load"
through=$((expected + 6000 - seq))
for n in 1 2; do
    reap "${restart_clients[n - 1]}"
    ((status == 0)) || fail "client $n dispatching through the restart exited $status after $(acks "$run/restart$n.out") acknowledgements"
    (($(acks "$run/restart$n.out") == 3000)) || fail "client $n got $(acks "$run/restart$n.out") acknowledgements of 3000"
done
expected=$((expected + 6000))
read_store "after the restart under load"
((seq == expected)) || fail "after the restart under load the store is at seq $seq; the acknowledged dispatches make $expected"
log=$(unit_log)
(($(grep -c 'daemon stopping: the last batch is committed' <<<"$log" || true) == drains + 1)) \
    || fail "the restarted instance did not log that it drained ('daemon stopping: the last batch is committed…')"
(($(grep -c 'Deactivated successfully' <<<"$log" || true) == clean_stops + 1)) \
    || fail "the restarted instance did not log 'Deactivated successfully' (a clean exit 0)"
pass "restart under load: the old instance exited 0 after draining, two clients' 6000 dispatches ($through of them answered by the new daemon) acknowledged and applied once (seq $seq) ($(since "$phase") s)"

# --- Stop: drains and exits 0; the journal is intact and the next start recovers all of it before READY=1. ---
phase=$(now)
ct systemctl stop "$unit.service" || fail "systemctl stop $unit exited $?"
result="$(prop ActiveState) $(prop Result) $(prop ExecMainStatus)"
[[ $result == "inactive success 0" ]] || fail "after systemctl stop: ActiveState Result ExecMainStatus = $result, expected inactive success 0"
ct "${T[@]}" journal verify "$state_dir" >"$run/verify.out" 2>&1 \
    || fail "'$tool_name journal verify $state_dir' after the stop: $(cat "$run/verify.out")"
ct systemctl start "$unit.service" || fail "the second systemctl start exited $?"
read_store "at once after the second start"
((seq == expected)) || fail "at once after the second start the store is at seq $seq, expected $expected"
ct systemctl stop "$unit.service"
result="$(prop ActiveState) $(prop Result) $(prop ExecMainStatus)"
[[ $result == "inactive success 0" ]] || fail "after the second stop: $result, expected inactive success 0"
pass "stop: exit 0, Result=success; journal verify intact; started again, it served all $expected events as soon as systemctl start returned ($(since "$phase") s)"

# --- What the log says over the whole run. ---
unit_log >"$run/unit.log"
# The watchdog's SIGABRT is the one signal expected; a filter refusing a call shows as SIGSYS (killed, in this test)
# or, from code that reports it, EPERM; a libzmq assertion as "message (src/file.cpp:line)".
bad=$(grep -E 'SIGSYS|status=31/SYS|Bad system call|Operation not permitted|EPERM|errno=1([^0-9]|$)|\(src/[a-z_]+\.[ch]pp:[0-9]+\)' "$run/unit.log" || true)
[[ -z $bad ]] || fail "the log of $unit shows refused calls or assertions: $bad"
kills=$(grep -E 'Main process exited, code=(killed|dumped)' "$run/unit.log" || true)
[[ $(grep -c . <<<"$kills") == 1 && $kills == *status=6/ABRT* ]] \
    || fail "expected one kill, the watchdog's SIGABRT; the log has: ${kills:-none}"
pass "log: no SIGSYS, EPERM or assertion in $(wc -l <"$run/unit.log") lines of journalctl -u $unit; the only kill was the watchdog's SIGABRT"

say "all checks passed in $(since "$started") s"
