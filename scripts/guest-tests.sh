#!/usr/bin/env bash
# Runs the tests that need a bigger machine than the build machine inside a
# throw-away guest (scripts/guest.sh): 8 CPUs in 2 sockets x 2 cores x 2
# hyperthreads, cgroup v2 only. They are the core arbiter's integration
# tests (grants, cooperative and forced release, crashes, priorities,
# limits, restarts, and placement by hyperthread sibling and socket), the
# runtime's tests against the daemon (a daemon killed mid-run included),
# the CPU budget's tests under nested cgroup v2 quotas and cpusets, and a
# short run of the core-grant benchmark on the cgroup v2 backend (its
# figures are printed, never compared: the guest's CPU is emulated). Then,
# in a second guest with systemd as init, the arbiter's systemd unit as
# shipped, started with the repository's defaults.
#
# The test binaries (cargo test --no-run), the benchmark and the daemon
# (debug builds) are built on the host and run unchanged in the guest, which sees the host's file system read-only.
# The guest's CPU is emulated and many times slower than the host's, so
# the waits are stretched (COREWISE_TEST_WAIT_S) and so is the daemon's
# reclaim timeout where a test does not set its own
# (COREWISE_TEST_RECLAIM_MS); the tests assert on cpuset membership and
# sched_getcpu, never on time. The whole guest run is bounded by
# GUEST_TIMEOUT_S (default 300 s).
set -euo pipefail
cd "$(dirname "$0")/.."

# The executable of the artifact of KIND that `cargo ARGS...` builds:
# "test" for an integration test target, "bin" for a binary (the daemon's
# binary, built for the arbiter's tests, is marked testable too, so the
# kind tells them apart).
artifact() {
    local kind=$1
    shift
    cargo "$@" --message-format=json \
        | grep "\"kind\":\[\"$kind\"\]" \
        | grep -o '"executable":"[^"]*"' \
        | sed 's/"executable":"\(.*\)"/\1/' \
        | tail -1
}

arbiter=$(artifact test test --no-run -p corewise-arbiter --test daemon)
runtime=$(artifact test test --no-run -p corewise --test daemon)
budget=$(artifact test test --no-run -p corewise --test budget)
bench=$(artifact bin build -p corewise-bench --bin corewise-bench)
daemon=$(artifact bin build -p corewise-arbiter --bin corewise-arbiter)
for b in "$arbiter" "$runtime" "$budget" "$bench" "$daemon"; do
    [ -x "$b" ] || { echo "guest-tests: no test binary ($b)" >&2; exit 1; }
done

# Each binary runs even if an earlier one failed; the status says whether
# any did. An argument "binary:filter" runs only the tests matching filter:
# of the budget tests only the cgroup v2 ones (the neighbour-share tests
# measure load, which an emulated CPU on a shared host does not give). The
# arbiter's check that a registering process is still alive needs
# SO_PEERPIDFD (Linux 6.5), which the guest's Debian 6.1 kernel lacks: that
# test runs on the host only. The benchmark (first argument) runs last,
# with few samples (about 10 s in the guest). Each binary gets at most
# GUEST_BINARY_S seconds (150; the longest takes about 45): one that hangs
# has its processes shown, each thread with its kernel stack, then is
# killed, so that a hang is named and the rest still runs.
script='
failed=0
bench=$1
shift
limit=${GUEST_BINARY_S:-150}
bounded() {
    "$@" &
    local pid=$! rc=0
    (
        sleep "$limit"
        kill -0 "$pid" 2>/dev/null || exit 0
        echo "=== guest: still running after ${limit} s, its processes and their threads:"
        ps -eo pid,ppid,stat,wchan:24,etime,args --forest
        for p in $pid $(pgrep -P "$pid"); do
            for t in /proc/$p/task/*; do
                echo "--- task ${t##*/} of $p ($(cat "$t/comm" 2>/dev/null)), $(cut -d" " -f3 "$t/stat" 2>/dev/null):"
                cat "$t/stack" 2>/dev/null
            done
        done
        pkill -KILL -P "$pid"
        kill -KILL "$pid"
    ) &
    local dog=$!
    wait "$pid" || rc=$?
    kill "$dog" 2>/dev/null
    wait "$dog" 2>/dev/null
    return $rc
}
for t in "$@"; do
    echo "=== guest: $t"
    bounded "${t%%:*}" --test-threads=2 ${t#*:} || failed=1
done
echo "=== guest: $bench core-grant --samples 100"
bounded "$bench" core-grant --samples 100 || failed=1
exit $failed
'
# The systemd unit on a fresh machine: no /etc/default/corewise-arbiter,
# no limits file (removed from the guest's copy of /etc if the host has
# them), the daemon at the unit's path. It must start, answer `status` on
# the default socket with its sets made under the cgroup v2 root, not have
# been restarted, and leave no set behind when stopped. Each step is
# bounded and says when it is done, so that a step that hangs is named and
# followed by what systemd shows (its pending jobs, the unit, its journal)
# instead of using up the guest's time in silence.
unit_check='
set -eu
t0=$(date +%s)
step() { echo "guest: $* ($(( $(date +%s) - t0 )) s)"; }
diagnose() {
    echo "guest: the unit check failed; what systemd shows:"
    timeout 20 systemctl list-jobs --no-pager || true
    timeout 20 systemctl status --no-pager corewise-arbiter.service || true
    timeout 20 journalctl --no-pager -b -u corewise-arbiter.service | tail -20 || true
}
trap diagnose ERR
step "systemd ran the check"
rm -f /etc/default/corewise-arbiter /etc/corewise-arbiter.toml
install -m 755 "$1" /usr/local/bin/corewise-arbiter
install -m 644 crates/corewise-arbiter/corewise-arbiter.service /etc/systemd/system/
timeout 60 systemctl daemon-reload
timeout 120 systemctl start corewise-arbiter.service
step "the unit started"
until corewise-arbiter status --timeout-s 5 >/dev/null 2>&1; do
    [ $(( $(date +%s) - t0 )) -lt 150 ] || break
    sleep 0.5
done
corewise-arbiter status --timeout-s 10
step "the daemon answered"
test "$(systemctl is-active corewise-arbiter.service)" = active
test "$(systemctl show -P NRestarts corewise-arbiter.service)" = 0
test -d /sys/fs/cgroup/corewise-unmanaged
timeout 60 systemctl stop corewise-arbiter.service
test -z "$(ls -d /sys/fs/cgroup/corewise-* 2>/dev/null)"
step "the systemd unit started with the defaults, answered, and stopped cleanly"
'
started=$(date +%s)
status=0
COREWISE_TEST_WAIT_S=${COREWISE_TEST_WAIT_S:-120} \
COREWISE_TEST_RECLAIM_MS=${COREWISE_TEST_RECLAIM_MS:-2000} \
    scripts/guest.sh -c 8 -t 2:2:2 -T "${GUEST_TIMEOUT_S:-300}" \
    -e COREWISE_TEST_WAIT_S -e COREWISE_TEST_RECLAIM_MS -e GUEST_BINARY_S \
    -- bash -c "$script" guest-tests "$bench" "$arbiter:--skip a_socket_kept_after_its_process_exited" "$runtime:" "$budget:v2_" || status=$?
# The rest of the bound goes to the unit's guest (about 30 s).
left=$(( ${GUEST_TIMEOUT_S:-300} - ($(date +%s) - started) ))
if [ "$left" -lt 30 ]; then
    echo "guest-tests: no time left for the systemd unit's guest" >&2
    exit 1
fi
echo "=== guest (systemd as init): the corewise-arbiter unit"
scripts/guest.sh -s -c 8 -t 2:2:2 -T "$left" -- bash -c "$unit_check" unit-check "$daemon" \
    || status=$?
exit $status
