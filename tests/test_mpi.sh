#!/usr/bin/env bash
# tests/test_mpi.sh BIN - the data-parallel checks of `make test-mpi`, on the test program BIN (built
# with mpicc from tests/test_mpi.c):
#   1. BIN under mpirun -np 2 on this machine (shared memory): it must pass; and under -np 3, where the
#      ranks get 3, 3 and 2 rows of the global batch of 8;
#   2. the same with a part of the data-parallel step left out (TFM_TEST_MUTATE: the all-reduce, the
#      batch offset, the broadcast, the loss weighting): each run must fail, or the test proves nothing;
#   3. rank 1 killed at step 5: the job must end with an error within 60 s, not hang or pass; and
#      rank 1 stalled at step 5 (alive, silent): with tfm_dist.timeout 5 s, rank 0's collective must
#      time out with an error that ends the job;
#   4. two network namespaces joined by a veth pair, one rank in each, launched as mpirun launches
#      on two hosts (its rsh agent, here `ip netns exec` instead of ssh) and talking TCP only, with
#      the collectives' non-blocking forms (--timeout 120), so both forms pass the test:
#      skipped with a message where namespaces cannot be made (not root, no `ip`, a container);
#   5. with CUDA_BIN and NCCL_BIN (tests/test_mpi.c built against the CPU emulation of CUDA, without and
#      with TFM_NCCL): the same checks on CUDA models, their gradients through the host, then through
#      NCCL (served by MPI in the emulation) under -np 2 and -np 3, where leaving out the all-reduce must
#      fail too; and once with the emulation running a non-blocking stream's work at the call instead of
#      when it is waited for (TFM_TEST_EAGER_STREAMS=1: tfm_dist_backward's buckets, sent on one, must
#      not start before the gradients in them are done). Fewer steps: each GPU thread is a fiber there.
# Prints "test-mpi: N passed, N failed" and exits non-zero if any failed.
set -uo pipefail

bin=${1:?usage: tests/test_mpi.sh BIN [CUDA_BIN NCCL_BIN]}
cuda_bin=${2:-}
nccl_bin=${3:-}
mpirun=${MPIRUN:-mpirun}
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
passed=0
failed=0
pass() { echo "test-mpi: ok   $*"; passed=$((passed + 1)); }
fail() { echo "test-mpi: FAIL $*"; failed=$((failed + 1)); }
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# 1. the test itself
echo "==== $mpirun -np 2 $bin"
if timeout 300 "$mpirun" "${flags[@]}" -np 2 "$bin"; then pass "2 ranks on one machine"; else fail "2 ranks on one machine"; fi
if timeout 300 "$mpirun" "${flags[@]}" -np 3 "$bin" >"$log" 2>&1; then
    pass "3 ranks on one machine (rows 3, 3 and 2): $(grep -c '^ok' "$log") checks"
else
    fail "3 ranks on one machine (rows 3, 3 and 2):"
    cat "$log"
fi

# 2. each mutation must make it fail
for m in allreduce offset broadcast weight; do
    if TFM_TEST_MUTATE=$m timeout 300 "$mpirun" "${flags[@]}" -np 2 -x TFM_TEST_MUTATE "$bin" --steps 10 >"$log" 2>&1; then
        fail "leaving out the $m still passes:"
        cat "$log"
    else
        pass "leaving out the $m fails the test ($(grep -c '^FAIL' "$log") checks failed)"
    fi
done

# 3. a rank killed mid-run: the others must stop with an error, not hang
t0=$SECONDS
timeout 60 "$mpirun" "${flags[@]}" -np 2 "$bin" --kill-at 5 >"$log" 2>&1
rc=$?
if [ $rc -eq 124 ]; then
    fail "rank 1 killed at step 5: the job still ran after 60 s"
elif [ $rc -eq 0 ] || grep -q ' passed, ' "$log"; then
    fail "rank 1 killed at step 5: the job reported success (exit $rc)"
else
    pass "rank 1 killed at step 5: the job stopped with exit status $rc after $((SECONDS - t0)) s: $(grep -m1 -E 'exited on signal|failed' "$log" | sed 's/^ *//')"
fi
t0=$SECONDS
timeout 60 "$mpirun" "${flags[@]}" -np 2 "$bin" --stall-at 5 --timeout 5 >"$log" 2>&1
rc=$?
if [ $rc -eq 124 ]; then
    fail "rank 1 stalled at step 5: the job still ran after 60 s"
elif [ $rc -eq 0 ] || ! grep -q 'timed out after 5 s' "$log"; then
    fail "rank 1 stalled at step 5: no timeout error (exit $rc):"
    cat "$log"
else
    pass "rank 1 stalled at step 5: rank 0 stopped after $((SECONDS - t0)) s: $(grep -m1 'timed out' "$log" | cut -c1-150)..."
fi

# 5. CUDA models on the emulation: gradients through the host, then through NCCL
if [ -n "$cuda_bin" ]; then
    run_cuda() { # WHAT NP STEPS BIN
        local x=()
        [ -n "${TFM_TEST_EAGER_STREAMS:-}" ] && x=(-x TFM_TEST_EAGER_STREAMS)
        echo "==== $mpirun -np $2 $4 --steps $3"
        if timeout 600 "$mpirun" "${flags[@]}" "${x[@]}" -np "$2" "$4" --steps "$3" >"$log" 2>&1; then
            pass "$1: $(grep -c '^ok' "$log") checks"
        else
            fail "$1:"
            cat "$log"
        fi
    }
    run_cuda "CUDA models (emulated), gradients through the host, 2 ranks" 2 6 "$cuda_bin"
    run_cuda "CUDA models (emulated), gradients and ZeRO-1 shares through NCCL, 2 ranks" 2 6 "$nccl_bin"
    run_cuda "CUDA models (emulated) through NCCL, 3 ranks" 3 3 "$nccl_bin"
    TFM_TEST_EAGER_STREAMS=1 run_cuda "CUDA models (emulated) through NCCL, 2 ranks, side streams run early" 2 3 "$nccl_bin"
    if TFM_TEST_MUTATE=allreduce timeout 600 "$mpirun" "${flags[@]}" -np 2 -x TFM_TEST_MUTATE "$nccl_bin" --steps 3 >"$log" 2>&1; then
        fail "CUDA models through NCCL: leaving out the all-reduce still passes:"
        cat "$log"
    else
        pass "CUDA models through NCCL: leaving out the all-reduce fails the test ($(grep -c '^FAIL' "$log") checks failed)"
    fi
fi

# 4. two network namespaces, TCP between them
netns_test() {
    local a=tfm_mpi_a b=tfm_mpi_b dir
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
        echo "test-mpi: skipping the two-namespace run: needs root and iproute2's ip"
        return
    fi
    if ! ip netns add $a 2>/dev/null; then
        echo "test-mpi: skipping the two-namespace run: cannot create a network namespace here"
        return
    fi
    dir=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; rm -rf '$dir' '$log'" EXIT
    if ! { ip netns add $b && ip link add tfm_veth_a type veth peer name tfm_veth_b &&
           ip link set tfm_veth_a netns $a && ip link set tfm_veth_b netns $b &&
           ip -n $a addr add 10.77.0.1/24 dev tfm_veth_a && ip -n $b addr add 10.77.0.2/24 dev tfm_veth_b &&
           ip -n $a link set tfm_veth_a up && ip -n $b link set tfm_veth_b up &&
           ip -n $a link set lo up && ip -n $b link set lo up; }; then
        echo "test-mpi: skipping the two-namespace run: could not set up the veth pair"
        return
    fi
    printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$dir/hosts"
    # mpirun starts its daemon on a remote host with `agent HOST COMMAND`: here HOST's namespace
    cat >"$dir/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift;; *) break;; esac; done
host=\$1; shift
case \$host in 10.77.0.1) ns=$a;; 10.77.0.2) ns=$b;; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
echo "\$host" >> "$dir/launched"
exec ip netns exec \$ns sh -c "\$*"
EOF
    chmod +x "$dir/agent"
    echo "==== two namespaces: ip netns exec $a $mpirun --hostfile (10.77.0.1, 10.77.0.2) --mca btl tcp,self $bin"
    if timeout 300 ip netns exec $a "$mpirun" --allow-run-as-root --hostfile "$dir/hosts" -np 2 \
        --mca plm_rsh_agent "$dir/agent" --mca btl tcp,self \
        --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$bin" --timeout 120 &&
        grep -q 10.77.0.2 "$dir/launched" 2>/dev/null; then
        pass "2 ranks in two network namespaces over TCP (rank 1 started in $b through the launcher's agent)"
    else
        fail "2 ranks in two network namespaces over TCP"
    fi
}
netns_test

echo "test-mpi: $passed passed, $failed failed"
[ $failed -eq 0 ]
