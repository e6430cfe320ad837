#!/usr/bin/env bash
# Runs the tests that need a bigger machine than the build machine inside a
# throw-away guest (scripts/guest.sh): 8 CPUs in 2 sockets x 2 cores x 2
# hyperthreads, cgroup v2 only. They are the core arbiter's integration
# tests (grants, cooperative and forced release, crashes, priorities,
# limits, restarts, and placement by hyperthread sibling and socket), the
# runtime's tests against the daemon (a daemon killed mid-run included),
# the CPU budget's tests under nested cgroup v2 quotas and cpusets, and a
# short run of the core-grant benchmark on the cgroup v2 backend (its
# figures are printed, never compared: the guest's CPU is emulated).
#
# The test binaries (cargo test --no-run) and the benchmark (a debug
# build) are built on the host and run unchanged in the guest, which sees the host's file system read-only.
# The guest's CPU is emulated and many times slower than the host's, so
# the waits are stretched (COREWISE_TEST_WAIT_S) and so is the daemon's
# reclaim timeout where a test does not set its own
# (COREWISE_TEST_RECLAIM_MS); the tests assert on cpuset membership and
# sched_getcpu, never on time. The whole guest run is bounded by
# GUEST_TIMEOUT_S (default 300 s).
set -euo pipefail
cd "$(dirname "$0")/.."

# The executable of one integration test target (the artifact of kind
# "test"; the daemon's binary, built for the arbiter's tests, is another).
test_binary() {
    cargo test --no-run --message-format=json "$@" \
        | grep '"kind":\["test"\]' \
        | grep -o '"executable":"[^"]*"' \
        | sed 's/"executable":"\(.*\)"/\1/' \
        | tail -1
}

arbiter=$(test_binary -p corewise-arbiter --test daemon)
runtime=$(test_binary -p corewise --test daemon)
budget=$(test_binary -p corewise --test budget)
bench=$(cargo build -p corewise-bench --bin corewise-bench --message-format=json \
    | grep '"kind":\["bin"\]' \
    | grep -o '"executable":"[^"]*"' \
    | sed 's/"executable":"\(.*\)"/\1/' \
    | tail -1)
for b in "$arbiter" "$runtime" "$budget" "$bench"; do
    [ -x "$b" ] || { echo "guest-tests: no test binary ($b)" >&2; exit 1; }
done

# Each binary runs even if an earlier one failed; the status says whether
# any did. An argument "binary:filter" runs only the tests matching filter:
# of the budget tests only the cgroup v2 ones (the neighbour-share tests
# measure load, which an emulated CPU on a shared host does not give). The
# arbiter's check that a registering process is still alive needs
# SO_PEERPIDFD (Linux 6.5), which the guest's Debian 6.1 kernel lacks: that
# test runs on the host only. The benchmark (first argument) runs last,
# with few samples (about 10 s in the guest).
script='
failed=0
bench=$1
shift
for t in "$@"; do
    echo "=== guest: $t"
    "${t%%:*}" --test-threads=2 ${t#*:} || failed=1
done
echo "=== guest: $bench core-grant --samples 100"
"$bench" core-grant --samples 100 || failed=1
exit $failed
'
COREWISE_TEST_WAIT_S=${COREWISE_TEST_WAIT_S:-120} \
COREWISE_TEST_RECLAIM_MS=${COREWISE_TEST_RECLAIM_MS:-2000} \
    scripts/guest.sh -c 8 -t 2:2:2 -T "${GUEST_TIMEOUT_S:-300}" \
    -e COREWISE_TEST_WAIT_S -e COREWISE_TEST_RECLAIM_MS \
    -- bash -c "$script" guest-tests "$bench" "$arbiter:--skip a_socket_kept_after_its_process_exited" "$runtime:" "$budget:v2_"
