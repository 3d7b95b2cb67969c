#!/usr/bin/env bash
# bench/profile.sh - where a training step's time goes, by category, for each reference model.
#
#   bench/profile.sh [THREADS]        (default 1; CONFIGS="a b" picks models, as in run.sh)
#
# Samples `build/bench train NAME THREADS` (warm-up plus timed training steps, nothing else) with
# `perf record -e cpu-clock` and sorts the samples by symbol into: sgemm (OpenBLAS or the built-in
# kernel, packing included), attention (softmax, masks and dropout around the attention products),
# element-wise (layernorm, GELU/ReLU, residual adds, bias sums, embeddings, cross-entropy), optimizer
# (gradient norm and AdamW), copies (memcpy/memset), threads (OpenMP runtime: waiting and handing out
# work), kernel (page faults, scheduling) and other. Sampling runs during the training steps only
# (build/bench switches it on and off through perf's control fifo), so model initialisation is left
# out. Needs perf (Debian: linux-perf).
set -u
cd "$(dirname "$0")/.." || exit 1
BENCH=${BENCH:-build/bench}
THREADS=${1:-1}
command -v perf >/dev/null || { echo "profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 1; }
[ -x "$BENCH" ] || { echo "profile.sh: $BENCH not found: make build/bench" >&2; exit 1; }
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=SkylakeX; fi
CONFIGS=${CONFIGS:-$("$BENCH" list)}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tfm-prof.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

printf '%-19s %3s %8s %7s %9s %12s %9s %7s %7s %7s %6s\n' config thr "step ms" sgemm attention element-wise optimizer copies threads kernel other
for c in $CONFIGS; do
    rm -f "$TMP/ctl"; mkfifo "$TMP/ctl"
    BENCH_PERF_CTL="$TMP/ctl" perf record -q -D -1 --control "fifo:$TMP/ctl" -e cpu-clock -F 999 -o "$TMP/perf.data" \
        "$BENCH" train "$c" "$THREADS" > "$TMP/out" 2>/dev/null
    step=$(sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p' "$TMP/out")
    perf report -i "$TMP/perf.data" --no-children --sort symbol --stdio 2>/dev/null |
        awk -v c="$c" -v t="$THREADS" -v step="$step" '
        /^ *[0-9.]+%/ {
            p = $1; sub(/%/, "", p); s = $0; sub(/^ *[0-9.]+% +\[[^]]*\] +/, "", s); sub(/ +$/, "", s)
            k = "other"
            if (s ~ /^sgemm_|^cblas_|^exec_blas|^inner_thread|^blas_thread|tfm__sgemm|tfm__gemv|^openblas|^gemm_/) k = "sgemm"
            else if (s ~ /attention|attn|softmax_row|tfm__max|tfm__dot|tfm__sum/) k = "attention"
            else if (s ~ /tfm_model_step/) k = "optimizer"
            else if (s ~ /^__mem(cpy|move|set)/) k = "copies"
            else if (s ~ /^tfm_|^tfm__/) k = "element-wise"
            else if (s ~ /^gomp_|^GOMP_|omp_|^do_spin|^futex|sched_yield/) k = "threads"
            else if ($0 ~ /\[k\]/) k = "kernel"
            v[k] += p
            tot += p
        }
        END {
            if (tot <= 0) { printf "%-19s %3s  (no samples)\n", c, t; exit }
            printf "%-19s %3s %8.1f %6.1f%% %8.1f%% %11.1f%% %8.1f%% %6.1f%% %6.1f%% %6.1f%% %5.1f%%\n", c, t, step,
                   100 * v["sgemm"] / tot, 100 * v["attention"] / tot, 100 * v["element-wise"] / tot,
                   100 * v["optimizer"] / tot, 100 * v["copies"] / tot, 100 * v["threads"] / tot,
                   100 * v["kernel"] / tot, 100 * v["other"] / tot
        }'
done
