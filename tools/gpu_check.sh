#!/usr/bin/env bash
# tools/gpu_check.sh - the one prepared command that checks transformer.h's CUDA backend on a machine
# with an NVIDIA GPU. Run it from anywhere; it works in the repository root. About 3 minutes on an H200
# without gpt2-124M-b16 and the profiles; 5 with them, untimed (each step has its own time limit, and the
# whole run a deadline of 6 minutes: the optional profiles go first when time runs short).
#
#   (a) the device (nvidia-smi) and the compiler (nvcc --version)
#   (b) tests/test_cuda.cu built with nvcc for the GPU's architecture (make build/test_cuda, else nvcc
#       directly) and run: it ends with "N passed, N failed"
#   (b2) where there are two GPUs and Open MPI, optional: tests/test_mpi.c on CUDA models with TFM_NCCL,
#       a process per GPU (make build/mpi/test_mpi_nccl; mpirun -np 2 ... --steps 20)
#   (c) compute-sanitizer memcheck, racecheck and (time allowing) synccheck over `test_cuda --small`
#   (d) the GPU benchmark: bench/tfm_cuda.cu by nvcc, bench/bench_gpu.c by cc (plain C), linked; run for
#       char-gpt-tiny, gpt-small, gpt2-124M-shape and gpt2-124M-b16 (16 x 1024); then bench/torch_gpu.py, PyTorch eager on the same
#       GPU (fp32 with TF32 off, and TF32 on as a second peer); ours also with cfg.precision bf16, against
#       PyTorch's autocast bf16 with SDPA, eager and torch.compile'd (torch_gpu.py --amp, gpt2-124M-b16).
#       Its build runs beside (b)'s. Then, optional, `bench_gpu --kernels`: the memory-bound ops (layernorm,
#       softmax, GELU, add, cross-entropy, AdamW) in GB/s against the device's copy bandwidth (target >= 0.70).
#       Then, optional, tools/bf16_tracking.cpp (built beside (b) too): a small character LM trained 300 steps
#       on transformer.h's own text in fp32 on the CPU and in bf16 on the GPU from the same weights: how far
#       apart their losses run (the worst 25-step mean and the worst step); and tools/bf16_tracking_torch.py,
#       PyTorch's autocast on the same model and batches on the GPU, for scale (small models' runs fork).
#   (d2) time allowing, ncu's kernel times over quick runs of the bench (gpt2-124M-b16's bf16 training
#       steps first, then fp32 training and decoding at batch 32): the CSVs beside the log
#       (ncu_train-bf16_CONFIG.csv, ncu_train_CONFIG.csv, ncu_gen32_CONFIG.csv), summarised by
#       tools/ncu_summary.py (where the time goes, by kernel)
#   (e) a summary: device, test counts, sanitizer error counts, the bench rows (ours, torch, ratio), the
#       memory-bound ops' share of the copy bandwidth, the profiles' top kernels
# Every step runs even when an earlier one failed; the exit status is 1 when any step failed.
#
# `bash tools/gpu_check.sh --prebuild` on a machine with nvcc and no GPU builds (b)'s and (d)'s three
# programs ahead (build/test_cuda, build/gpu_check/bench_gpu and bf16_tracking, for GPU_CHECK_ARCH, default
# sm_90a: an H100's or H200's) and stamps them (build/gpu_check/prebuilt: the target, the flags, nvcc's
# version, a sha256 of every source that goes in and one of the programs). Carried to the GPU's machine
# (build/test_cuda and build/gpu_check), they spare it the builds, which there cost device time: a run
# there takes them when the stamp matches its own target, flags, nvcc, sources and programs, and ldd finds
# every library they need; else it builds as before.
#
# Everything goes to one log: $GPU_CHECK_LOG, else $OUT/gpu_check.log when OUT is set (the device tool's
# folder of returned files), else ./gpu_check.log; the summary also goes to stdout. Environment:
#   GPU_CHECK_SKIP_BENCH=1   no benchmark (a quick rerun after a fix)
#   GPU_CHECK_ONLY_TESTS=1   build and run the tests only (no sanitizers, no benchmark)
#   GPU_CHECK_DEADLINE=S     seconds for the whole run (default 350)
#   GPU_CHECK_ARCH=sm_NN     target (default: the GPU's compute capability, else sm_90; sm_90a for 9.0, which
#                            builds Hopper's own instructions, wgmma, into the flash forward)
#   GPU_CHECK_CONFIGS="..."  bench configs (default: char-gpt-tiny gpt-small gpt2-124M-shape gpt2-124M-b16)
#   GPU_CHECK_AMP_CONFIGS="..." configs of PyTorch's bf16 rows (default: gpt2-124M-b16, the target shape)
#   GPU_CHECK_LEAKS=1        memcheck with --leak-check full (cuBLAS's own allocations may show)
#   GPU_CHECK_PROFILE=0      no ncu profile (default, when time is left: the bf16 training steps alone of each
#                            of GPU_CHECK_PROFILE_BF16, default gpt2-124M-b16, the bf16 target's shape; then
#                            a quick training run and batch-32 decoding of each of GPU_CHECK_PROFILE_CONFIGS,
#                            default gpt-small gpt2-124M-shape)
#   NVCC, CC, PYTHON         the tools (default nvcc, cc, python3)
set -u
cd "$(dirname "$0")/.." || exit 2
PREBUILD=0
if [ "${1:-}" = --prebuild ]; then
    PREBUILD=1
elif [ $# -gt 0 ]; then
    echo "usage: bash tools/gpu_check.sh [--prebuild]   (settings: GPU_CHECK_* in the environment)" >&2
    exit 2
fi

LOG=${GPU_CHECK_LOG:-}
if [ -z "$LOG" ] && [ "$PREBUILD" = 1 ]; then LOG=build/gpu_check/prebuild.log; fi
if [ -z "$LOG" ]; then
    if [ -n "${OUT:-}" ]; then LOG="$OUT/gpu_check.log"; else LOG=gpu_check.log; fi
fi
DEADLINE=${GPU_CHECK_DEADLINE:-350}
SKIP_BENCH=${GPU_CHECK_SKIP_BENCH:-0}
ONLY_TESTS=${GPU_CHECK_ONLY_TESTS:-0}
if [ "$ONLY_TESTS" = 1 ]; then SKIP_BENCH=1; fi
BUILD_LIMIT=240 # seconds for each build
if [ "$PREBUILD" = 1 ]; then # three nvcc builds side by side, on what may be two cores
    SKIP_BENCH=0 ONLY_TESTS=0 BUILD_LIMIT=1500 DEADLINE=${GPU_CHECK_DEADLINE:-1800}
fi
BENCH_CONFIGS=${GPU_CHECK_CONFIGS:-char-gpt-tiny gpt-small gpt2-124M-shape gpt2-124M-b16}
AMP_CONFIGS=${GPU_CHECK_AMP_CONFIGS:-gpt2-124M-b16}
PROFILE=${GPU_CHECK_PROFILE:-1}
PROFILE_CONFIGS=${GPU_CHECK_PROFILE_CONFIGS:-gpt-small gpt2-124M-shape}
PROFILE_BF16=${GPU_CHECK_PROFILE_BF16:-gpt2-124M-b16}
CC=${CC:-cc}
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
for s in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
    /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/compute-sanitizer/compute-sanitizer; do
    if [ -z "$SANITIZER" ] && [ -x "$s" ]; then SANITIZER=$s; fi
done
B=build/gpu_check
mkdir -p "$B" "$(dirname "$LOG")" || exit 2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
: > "$LOG" || exit 2

START=$(date +%s.%N)
elapsed() { awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
left() { awk -v s="$START" -v n="$(date +%s.%N)" -v d="$DEADLINE" 'BEGIN { printf "%d", d - (n - s) }'; }
log() { printf '%s\n' "$*" | tee -a "$LOG"; }

STEPS=()     # "name|status|seconds" per step, for the summary
FAILED=0
record() { # name rc seconds [optional]
    local st=ok
    case $2 in
    0) st=ok ;;
    124 | 137) st="TIMEOUT" ;;
    skip) st="skipped (no time left)" ;;
    off) st="not run" ;;
    *) st="FAILED (exit $2)" ;;
    esac
    if [ "$2" != 0 ] && [ "$2" != off ] && [ "${4:-}" != optional ]; then FAILED=1; fi
    STEPS+=("$1|$st|$3")
}

# run_step NAME BUDGET RESERVE OUTFILE [optional] -- CMD...: CMD under `timeout`, for at most BUDGET
# seconds and never into the last RESERVE seconds before the deadline (which later steps need); its
# output to OUTFILE and the log. A step left with under 5 seconds is skipped.
run_step() {
    local name=$1 budget=$2 reserve=$3 out=$4 opt="" t rc t0 secs
    shift 4
    if [ "${1:-}" = optional ]; then opt=optional; shift; fi
    if [ "${1:-}" = -- ]; then shift; fi
    t=$(($(left) - reserve))
    if [ "$t" -gt "$budget" ]; then t=$budget; fi
    log ""
    log "== [$(elapsed) s] $name (limit ${t} s): $*"
    if [ "$t" -lt 5 ]; then
        log "== $name: skipped, $(left) s left before the deadline"
        record "$name" skip 0 $opt
        : > "$out"
        return 0
    fi
    t0=$(date +%s.%N)
    timeout -k 5 "$t" "$@" 2>&1 | tee "$out" >> "$LOG" # the log grows as the step runs
    rc=${PIPESTATUS[0]}
    secs=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then log "== $name: TIMEOUT after ${t} s"; fi
    log "== [$(elapsed) s] $name: exit $rc, ${secs} s"
    record "$name" "$rc" "$secs" $opt
    return "$rc"
}

# ---- (a) device and compiler -------------------------------------------------------------------------
log "== tools/gpu_check.sh  $(date '+%F %T')  host $(hostname)  deadline ${DEADLINE} s  log $LOG"
log "== git: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (+ uncommitted changes)')"
# a copy of the tree may carry an older .git than its files: the header's blob id names what ran
# (git log --find-object=ID finds the commits that hold it)
log "== transformer.h sha256 $(sha256sum transformer.h 2>/dev/null | cut -c1-16) (git hash-object $(git hash-object transformer.h 2>/dev/null | cut -c1-12))"
if [ "$PREBUILD" = 1 ]; then # no GPU: the compiler only
    run_step "device" 15 0 "$TMP/device.txt" -- "$NVCC" --version
else
    # shellcheck disable=SC2016  # $1 expands in the inner shell
    run_step "device" 15 0 "$TMP/device.txt" -- bash -c \
        'nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader &&
         "$1" --version' _ "$NVCC"
fi
cat "$TMP/device.txt"
DEVICE=$(grep -m1 '^GPU 0' "$TMP/device.txt" | sed 's/ (UUID.*//')
CAP=$(grep -m1 -Eo ', [0-9]+\.[0-9]+, ' "$TMP/device.txt" | tr -dc '0-9')
ARCH=sm_${CAP:-90}
[ "$ARCH" = sm_90 ] && ARCH=sm_90a
ARCH=${GPU_CHECK_ARCH:-$ARCH}
NVCCFLAGS="-O2 -std=c++17 -arch=$ARCH -Xcompiler -fopenmp"
log "== target $ARCH; NVCCFLAGS=$NVCCFLAGS; compute-sanitizer: ${SANITIZER:-not found}"

# ---- the programs: prebuilt (--prebuild, above), else built here ---------------------------------------
# The key a prebuilt set's stamp must match: the target and flags, nvcc's version, the sources' sha256
prebuilt_key() {
    {
        echo "arch=$ARCH flags=$NVCCFLAGS"
        "$NVCC" --version 2>&1 | tail -1
        sha256sum transformer.h tests/test_cuda.cu tests/test.h tests/cuda_emu.h bench/tfm_cuda.cu bench/bench_gpu.c \
            bench/bench_util.h tools/bf16_tracking.cpp Makefile 2>&1
    } | sha256sum | cut -c1-64
}
# ... and the programs' own sha256 (a later `make cuda` replaces build/test_cuda with another build)
programs_sum() { sha256sum build/test_cuda "$B/bench_gpu" "$B/bf16_tracking" 2>&1 | sha256sum | cut -c1-64; }
PREBUILT=0
PROGRAMS="built here"
if [ "$PREBUILD" = 0 ] && [ -s "$B/prebuilt" ]; then
    why=""
    [ "$(head -1 "$B/prebuilt")" = "key $(prebuilt_key)" ] || why="the stamp's target, flags, nvcc or sources differ"
    [ -n "$why" ] || [ "$(sed -n 3p "$B/prebuilt")" = "programs $(programs_sum)" ] || why="the programs are not the ones stamped"
    for f in build/test_cuda "$B/bench_gpu" "$B/bf16_tracking"; do
        if [ -z "$why" ] && { [ ! -x "$f" ] || ldd "$f" 2>&1 | grep -q 'not found'; }; then
            why="$f is missing, or ldd does not find its libraries"
        fi
    done
    if [ -z "$why" ]; then
        PREBUILT=1
        PROGRAMS="prebuilt: $(sed -n 2p "$B/prebuilt")"
        log "== prebuilt programs taken (no builds): $(sed -n 2p "$B/prebuilt")"
    else
        PROGRAMS="built here (prebuilt ones not taken: $why)"
        log "== prebuilt programs not taken ($why): built here"
    fi
fi
if [ "$PREBUILT" = 0 ]; then rm -f "$B/prebuilt"; fi # what is built next is not what the stamp named

# ---- the bench build, in the background beside the tests' build ------------------------------------
BENCH_BUILD_PID=
TRACK_BUILD_PID=
TRACKING="not run"
if [ "$PREBUILT" = 1 ]; then
    echo "0 0.0" > "$TMP/bench_build.rc"
    echo "prebuilt" > "$TMP/bench_build.txt"
    echo "0 0.0" > "$TMP/track_build.rc"
    : > "$TMP/track_build.txt"
elif [ "$SKIP_BENCH" != 1 ]; then
    log "== [$(elapsed) s] bench build started in the background (its output follows in step bench-build)"
    (
        t0=$(date +%s.%N)
        # shellcheck disable=SC2016  # the inner shell expands its own arguments ($2: the flags, split)
        timeout -k 5 "$BUILD_LIMIT" bash -c '
            set -x
            "$1" $2 -c bench/tfm_cuda.cu -o "$3/tfm_cuda.o" &&
            "$4" -std=c99 -O2 -Wall -Wextra -c bench/bench_gpu.c -o "$3/bench_gpu.o" &&
            "$1" -arch="$5" -Xcompiler -fopenmp -o "$3/bench_gpu" "$3/bench_gpu.o" "$3/tfm_cuda.o" -lcublas -lcublasLt -lm
        ' _ "$NVCC" "$NVCCFLAGS" "$B" "$CC" "$ARCH" > "$TMP/bench_build.txt" 2>&1
        echo "$? $(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')" > "$TMP/bench_build.rc"
    ) &
    BENCH_BUILD_PID=$!
    # shellcheck disable=SC2086  # NVCCFLAGS is a list of flags
    (
        t0=$(date +%s.%N)
        timeout -k 5 "$BUILD_LIMIT" "$NVCC" $NVCCFLAGS -x cu -DTFM_CUDA -o "$B/bf16_tracking" tools/bf16_tracking.cpp -lcublas -lcublasLt \
            -lm > "$TMP/track_build.txt" 2>&1
        echo "$? $(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')" > "$TMP/track_build.rc"
    ) &
    TRACK_BUILD_PID=$!
fi

# The test's closing "N passed, N failed" line, else what it printed last (a suite line: "ops  12 passed, ...").
final_counts() {
    local c
    c=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -1)
    if [ -n "$c" ]; then echo "$c"; else echo "no closing 'N passed, N failed' line; last line: $(grep -v '^==' "$1" | tail -1 | cut -c1-100)"; fi
}

# ---- (b) tests/test_cuda.cu ---------------------------------------------------------------------
if [ "$PREBUILT" = 0 ]; then rm -f build/test_cuda; fi
BUILD_RESERVE=100 # for the test run and the sanitizers after the build
TEST_RESERVE=90   # for the sanitizers and the bench after the test
if [ "$ONLY_TESTS" = 1 ]; then BUILD_RESERVE=30 TEST_RESERVE=3; fi
# The Makefile's rule for build/test_cuda alone (`make cuda` also builds the TFM_CUDA compile checks, which
# need no GPU: they run where nvcc is), with these flags: no -Werror, so a new warning costs no GPU session.
if [ "$PREBUILT" = 1 ]; then
    log "== test-build: prebuilt"
    record "test-build" 0 0
elif [ -f tests/test_cuda.cu ] && make -B -n build/test_cuda NVCCFLAGS="$NVCCFLAGS" 2>/dev/null | grep -q 'tests/test_cuda.cu'; then
    run_step "test-build" "$BUILD_LIMIT" "$BUILD_RESERVE" "$TMP/test_build.txt" -- \
        make --no-print-directory build/test_cuda NVCC="$NVCC" NVCC_ARCH="$ARCH" NVCCFLAGS="$NVCCFLAGS"
else
    mkdir -p build
    # shellcheck disable=SC2086  # NVCCFLAGS is a list of flags
    run_step "test-build" "$BUILD_LIMIT" "$BUILD_RESERVE" "$TMP/test_build.txt" -- \
        "$NVCC" $NVCCFLAGS -DTFM_CUDA -o build/test_cuda tests/test_cuda.cu -lcublas -lcublasLt -lm
fi
if [ "$PREBUILD" = 1 ]; then # wait for the other two builds, stamp the three when all are built, and stop
    wait "$BENCH_BUILD_PID" "$TRACK_BUILD_PID"
    cat "$TMP/bench_build.txt" "$TMP/track_build.txt" >> "$LOG"
    read -r brc bsecs < "$TMP/bench_build.rc" || brc=1
    record "bench-build" "$brc" "${bsecs:-0}"
    read -r trc tsecs < "$TMP/track_build.rc" || trc=1
    record "bf16-tracking-build" "$trc" "${tsecs:-0}"
    if [ "$FAILED" = 0 ] && [ -x build/test_cuda ] && [ -x "$B/bench_gpu" ] && [ -x "$B/bf16_tracking" ]; then
        rm -f "$B/tfm_cuda.o" "$B/bench_gpu.o" # not needed to run: less to carry
        printf 'key %s\n%s\nprograms %s\n' "$(prebuilt_key)" "built for $ARCH $(date '+%F %T') on $(hostname) from $(git log -1 --format=%h 2>/dev/null)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + uncommitted changes')" "$(programs_sum)" > "$B/prebuilt"
        log "== prebuilt: build/test_cuda $B/bench_gpu $B/bf16_tracking ($(du -csh build/test_cuda "$B/bench_gpu" "$B/bf16_tracking" | tail -1 | cut -f1)); carry build/test_cuda and $B"
    else
        log "== prebuild: SOME BUILDS FAILED (above); nothing stamped"
    fi
    for s in "${STEPS[@]}"; do log "  $s"; done
    rm -rf "$TMP"
    exit "$FAILED"
fi
TEST_COUNTS="not run"
if [ -x build/test_cuda ]; then
    run_step "test" 60 "$TEST_RESERVE" "$TMP/test.txt" -- build/test_cuda
    TEST_COUNTS=$(final_counts "$TMP/test.txt")
    if ! grep -qE '^[0-9]+ passed, [0-9]+ failed' "$TMP/test.txt"; then # e.g. "no CUDA device: skipped"
        FAILED=1
        STEPS[${#STEPS[@]} - 1]="test|FAILED (no 'N passed' line)|$(echo "${STEPS[${#STEPS[@]} - 1]}" | cut -d'|' -f3)"
    fi
else
    log "== test: build/test_cuda was not built"
    record "test" 1 0
fi

# ---- (b2) NCCL: tests/test_mpi.c on CUDA models, two processes on two GPUs (where there are two and MPI) ----
N_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$N_GPUS" -lt 2 ]; then
    log "== nccl: skipped (NCCL wants a GPU per rank; this machine has $N_GPUS)"
elif command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    run_step "nccl-build" 60 "$TEST_RESERVE" "$TMP/nccl_build.txt" optional -- \
        make --no-print-directory build/mpi/test_mpi_nccl NVCC="$NVCC" NVCC_ARCH="$ARCH" NVCCFLAGS="$NVCCFLAGS"
    if [ -x build/mpi/test_mpi_nccl ]; then
        run_step "nccl" 60 "$TEST_RESERVE" "$TMP/nccl.txt" optional -- \
            mpirun --oversubscribe $([ "$(id -u)" -eq 0 ] && echo --allow-run-as-root) -np 2 build/mpi/test_mpi_nccl --steps 20
    fi
else
    log "== nccl: skipped (no mpicc/mpirun here: tests/test_mpi.c through NCCL needs Open MPI)"
fi

# ---- (c) compute-sanitizer over the small shapes --------------------------------------------------
SAN_SUMMARY=()
# shellcheck disable=SC2086  # $opt and $extra: absent when empty, else one word each
sanitize() { # tool budget [optional] [test name filter]
    local tool=$1 budget=$2 opt=${3:-} filter=${4:-} extra="" errs
    # memcheck: memory errors of kernels only; the test's own out-of-memory cases are API errors on purpose
    if [ "$tool" = memcheck ]; then extra="--report-api-errors no"; fi
    if [ "$tool" = memcheck ] && [ "${GPU_CHECK_LEAKS:-0}" = 1 ]; then extra="$extra --leak-check full"; fi
    if [ -z "$SANITIZER" ] || [ ! -x build/test_cuda ]; then
        log "== $tool: not run (compute-sanitizer or build/test_cuda missing)"
        record "$tool" 1 0 $opt
        SAN_SUMMARY+=("$tool: not run")
        return
    fi
    # keep 150 s for the benchmark after it (about 100 s on an H100; none when it is skipped)
    run_step "$tool" "$budget" "$([ "$SKIP_BENCH" = 1 ] && echo 5 || echo 150)" "$TMP/$tool.txt" $opt -- \
        "$SANITIZER" --tool "$tool" $extra --error-exitcode 99 build/test_cuda --small $filter
    errs=$(grep -Eo 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: .*\([0-9]+ error' "$TMP/$tool.txt" | tail -1 |
        grep -Eo '[0-9]+ error' | grep -Eo '[0-9]+')
    if [ -s "$TMP/$tool.txt" ]; then
        SAN_SUMMARY+=("$tool: ${errs:-?} errors; test: $(final_counts "$TMP/$tool.txt")")
    else
        SAN_SUMMARY+=("$tool: skipped (time)")
    fi
}
if [ "$ONLY_TESTS" != 1 ]; then
    sanitize memcheck 60
    # racecheck is the slowest: over the ops' and the attention's tests (cu_op_*), which run every kernel
    # that shares memory between threads; the models' steps only call those kernels again
    sanitize racecheck 90 "" cu_op_
    sanitize synccheck 40 optional
fi

# ---- (d) the benchmark: ours (plain C program + the .cu implementation) and PyTorch ---------------
: > "$TMP/results.txt"
if [ "$SKIP_BENCH" != 1 ]; then
    log ""
    log "== [$(elapsed) s] bench-build: waiting for the background build"
    wait "$BENCH_BUILD_PID"
    read -r brc bsecs < "$TMP/bench_build.rc" || { brc=1; bsecs=0; }
    cat "$TMP/bench_build.txt" >> "$LOG"
    log "== [$(elapsed) s] bench-build: exit $brc, ${bsecs} s (in parallel with test-build)"
    record "bench-build" "$brc" "$bsecs"
    if [ "$brc" = 0 ] && [ -x "$B/bench_gpu" ]; then
        for c in $BENCH_CONFIGS; do
            run_step "bench $c" 90 50 "$TMP/bench_$c.txt" -- env BENCH_GPU_BUDGET=3 "$B/bench_gpu" --tf32 --bf16 "$c"
            grep -E '^(RESULT|INFO|FAIL)' "$TMP/bench_$c.txt" >> "$TMP/results.txt"
        done
        # the memory-bound ops (mode=kernel rows) against a device-to-device copy, in the same run
        run_step "bench kernels" 40 30 "$TMP/bench_kernels.txt" optional -- env BENCH_GPU_BUDGET=1 "$B/bench_gpu" --kernels
        grep -E '^(RESULT|FAIL)' "$TMP/bench_kernels.txt" >> "$TMP/results.txt"
    else
        record "bench (ours)" 1 0
    fi
    # shellcheck disable=SC2086  # the config names are words
    run_step "torch" 160 3 "$TMP/torch.txt" -- env PYTHONUNBUFFERED=1 BENCH_GPU_BUDGET=3 "$PYTHON" bench/torch_gpu.py $BENCH_CONFIGS
    grep -E '^(RESULT|INFO|FAIL)' "$TMP/torch.txt" >> "$TMP/results.txt"
    # PyTorch's bf16 peers (autocast + SDPA's flash attention, eager and torch.compile) for the GPT-2 shapes
    # shellcheck disable=SC2086
    run_step "torch amp" 150 3 "$TMP/torch_amp.txt" optional -- env PYTHONUNBUFFERED=1 BENCH_GPU_BUDGET=3 "$PYTHON" \
        bench/torch_gpu.py --amp --no-gen --no-tf32 $AMP_CONFIGS
    grep -E '^RESULT .*prec=bf16|^FAIL' "$TMP/torch_amp.txt" >> "$TMP/results.txt"
    # does a bf16 run track the fp32 one? (tools/bf16_tracking.cpp, on the header's own text)
    wait "$TRACK_BUILD_PID"
    cat "$TMP/track_build.txt" >> "$LOG"
    read -r trc _ 2>/dev/null < "$TMP/track_build.rc" || trc=1
    if [ "$trc" = 0 ] && [ -x "$B/bf16_tracking" ]; then
        run_step "bf16 tracking" 45 3 "$TMP/tracking.txt" optional -- "$B/bf16_tracking" transformer.h 300 2 1
        TRACKING=$(grep -m1 '^worst single step' "$TMP/tracking.txt" || echo "no result")
        # PyTorch's autocast on the same model, batches and optimizer: how far its bf16 run forks, for scale
        run_step "bf16 tracking torch" 45 3 "$TMP/tracking_torch.txt" optional -- env PYTHONUNBUFFERED=1 "$PYTHON" \
            tools/bf16_tracking_torch.py transformer.h 300 1 cuda
        TRACKING="$TRACKING; PyTorch autocast: $(grep -m1 '^worst single step' "$TMP/tracking_torch.txt" || echo "no result")"
    else
        log "== bf16 tracking: the build failed (above)"
        record "bf16 tracking build" 1 0 optional
        TRACKING="not built"
    fi
fi

# ---- (d2) where the time goes: ncu's kernel times over quick bench runs (optional, time allowing) -----
NCU=$(command -v ncu 2>/dev/null)
if [ -z "$NCU" ] && [ -x /usr/local/cuda/bin/ncu ]; then NCU=/usr/local/cuda/bin/ncu; fi
PROFILES=()
if [ "$SKIP_BENCH" != 1 ] && [ "$PROFILE" = 1 ] && [ -n "$NCU" ] && [ -x "$B/bench_gpu" ]; then
    OUTDIR=$(dirname "$LOG")
    # the bf16 target's steps first (about 500 kernels a step at gpt2-124M-b16), then the fp32 ones and decoding
    for cm in $(for c in $PROFILE_BF16; do echo "$c:train-bf16"; done) \
        $(for c in $PROFILE_CONFIGS; do echo "$c:train $c:gen32"; done); do
        c=${cm%:*} mode=${cm##*:}
        f="$OUTDIR/ncu_${mode}_$c.csv"
        case $mode in
        train-bf16) what=(--bf16 --no-fp32 --no-gen) n=1200 budget=60 ;;
        train) what=(--no-gen) n=2500 budget=45 ;;
        *) what=(--no-train --gen-batch 32) n=3000 budget=45 ;;
        esac
        run_step "profile $mode $c" "$budget" 3 "$f" optional -- "$NCU" --clock-control none --metrics gpu__time_duration.sum \
            --print-summary per-kernel --csv --launch-count "$n" "$B/bench_gpu" --quick --no-check "${what[@]}" "$c"
        if [ -s "$f" ]; then PROFILES+=("$f"); fi
    done
fi

# ---- (e) summary --------------------------------------------------------------------------------------
{
    echo ""
    echo "================================ summary ================================"
    echo "device:  ${DEVICE:-?} ($ARCH)"
    echo "commit:  $(git log -1 --format='%h' 2>/dev/null)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + uncommitted changes')"
    echo "programs: $PROGRAMS"
    echo "tests:   ${TEST_COUNTS}"
    # the tensor-core layouts as the header reads them from the PTX ISA: a failure voids every bf16 attention number
    if [ -s "$TMP/test.txt" ]; then
        echo "layouts: $(grep -cE 'FAIL .*(mma16816|ldmatrix by|wgmma|fexp\()' "$TMP/test.txt") failures in cu_mma16816," \
            "cu_wgmma, cu_fexp (any: the bf16 attention numbers below are void)$(grep -q 'built without wgmma' "$TMP/test.txt" &&
            echo '; wgmma not built in (not sm_90a)')"
    fi
    for s in ${SAN_SUMMARY[@]+"${SAN_SUMMARY[@]}"}; do echo "sanitizer ${s}"; done
    echo "bf16 tracking (300 steps, fp32 CPU against bf16 GPU, tools/bf16_tracking.cpp on transformer.h): $TRACKING"
    echo "steps:"
    for s in "${STEPS[@]}"; do
        IFS='|' read -r n st secs <<< "$s"
        printf '  %-28s %-28s %7s s\n' "$n" "$st" "$secs"
    done
    if [ -s "$TMP/results.txt" ]; then
        awk '
        function kvs(   i, p) { delete kv; for (i = 2; i <= NF; i++) { p = index($i, "="); if (p) kv[substr($i, 1, p - 1)] = substr($i, p + 1) } }
        function num(x) { return x != "" && x + 0 > 0 }
        function f(x, fmt) { return (x ~ /^[0-9]/) ? sprintf(fmt, x) : "-" } # a number, 0 too; "-" for none, -1, nan
        function ratio(a, b) { return (num(a) && num(b)) ? sprintf("%.2f", a / b) : "-" }
        function kernels(   i, n) {
            if (!nk) return
            print "\nmemory-bound kernels, share of the device'"'"'s copy bandwidth (target >= 0.70)"
            printf "%-18s %13s %10s %9s %7s\n", "op", "rows x cols", "us", "GB/s", "share"
            for (i = 1; i <= nk; i++) {
                n = korder[i]
                printf "%-18s %13s %10s %9s %7s%s\n", n, kshape[n], f(kus[n], "%.1f"), f(kgbs[n], "%.0f"),
                       f(kshare[n], "%.3f"), (n != "copy" && n !~ /^linear_bias/ && num(kshare[n]) && kshare[n] + 0 < 0.70) ? "  below" : ""
            }
            if (("linear_bias_lt" in kus) && ("linear_bias_fill" in kus))
                printf "the bias in the product'"'"'s epilogue (cuBLASLt) against filled in and added to: %s us against %s us, %s x as fast\n", f(kus["linear_bias_lt"], "%.1f"), f(kus["linear_bias_fill"], "%.1f"), ratio(kus["linear_bias_fill"], kus["linear_bias_lt"])
            if (("xent_fused_bf16" in kus) && ("cross_entropy_fwd" in kus) && ("xent_bwd_bf16" in kus) && num(kus["cross_entropy_fwd"]) && num(kus["xent_bwd_bf16"]))
                printf "a bf16 LM'"'"'s loss and logit gradients in one launch from bf16 logits against two from fp32 ones: %s us against %s + %s us, %s x as fast\n", f(kus["xent_fused_bf16"], "%.1f"), f(kus["cross_entropy_fwd"], "%.1f"), f(kus["xent_bwd_bf16"], "%.1f"), ratio(kus["cross_entropy_fwd"] + kus["xent_bwd_bf16"], kus["xent_fused_bf16"])
            print "GB/s: the bytes the op must move at least (bench_gpu.c'"'"'s KOPS) over its median time; copy: a"
            print "device-to-device tfm_tensor_copy of 256 MB (2 x 256 MB moved), the peer of every share"
        }
        /^RESULT / {
            kvs()
            if (kv["mode"] == "kernel") {
                n = kv["name"]; if (!(n in kseen)) { kseen[n] = 1; korder[++nk] = n }
                kshape[n] = kv["rows"] "x" kv["cols"]; kus[n] = kv["us"]; kgbs[n] = kv["gbs"]; kshare[n] = kv["share"]
                next
            }
            n = kv["name"]; if (!(n in seen)) { seen[n] = 1; order[++nn] = n }
            if (kv["mode"] == "train") {
                p = ("prec" in kv) ? kv["prec"] : (kv["tf32"] == 1 ? "tf32" : "fp32")
                ms[kv["impl"], n, p] = kv["step_ms"]; tf[kv["impl"], n, p] = kv["tflops"]; mfu[kv["impl"], n, p] = kv["mfu"]
                rpt[kv["impl"], n, p] = kv["replayed"]
                if (p == "fp32") mb[kv["impl"], n] = (kv["impl"] == "ours") ? kv["model_mb"] : kv["peak_mb"]
                if (p ~ /^bf16/) has_bf16 = 1
            }
            if (kv["mode"] == "fwd") { fms[kv["impl"], n] = kv["fwd_ms"]; frp[kv["impl"], n] = kv["replayed"]; has_fwd = 1 }
            if (kv["mode"] == "gen" && kv["prec"] == "bf16") { tokb[kv["impl"], n] = kv["tok_s"]; has_bf16_gen = 1 }
            else if (kv["mode"] == "gen") { tok[kv["impl"], n, kv["batch"]] = kv["tok_s"]; rp[kv["impl"], n, kv["batch"]] = kv["replayed"] }
            if (kv["mode"] == "check") check[n] = kv["ok"] " (loss cpu " kv["loss_cpu"] ", gpu " kv["loss_gpu"] ", rel " kv["rel_err"] ")"
        }
        /^FAIL / { fails = fails "\n  " $0 }
        END {
            if (nn == 0) {
                print "\nbench: no RESULT lines" (nk ? " of the models" : "") (fails != "" ? "; failures:" fails : "")
                kernels()
                exit
            }
            print "\ntraining step, ms (median; zero_grad + forward + backward + AdamW), TFLOP/s by bench.c'"'"'s formula"
            printf "%-18s %9s %9s %7s %7s %7s   %9s %9s %7s   %13s   %9s %7s %8s\n", "config", "ours", "torch", "torch/", "ours",
                   "torch", "ours", "torch", "torch/", "MB", "no graphs", "nog/", "replayed"
            printf "%-18s %9s %9s %7s %7s %7s   %9s %9s %7s   %13s   %9s %7s %8s\n", "", "fp32", "fp32", "ours", "TFLOPs", "TFLOPs",
                   "tf32", "tf32", "ours", "ours/torch", "fp32", "ours", "fp32"
            for (i = 1; i <= nn; i++) {
                n = order[i]
                printf "%-18s %9s %9s %7s %7s %7s   %9s %9s %7s   %13s   %9s %7s %8s\n", n, f(ms["ours", n, "fp32"], "%.2f"),
                       f(ms["torch", n, "fp32"], "%.2f"), ratio(ms["torch", n, "fp32"], ms["ours", n, "fp32"]),
                       f(tf["ours", n, "fp32"], "%.2f"), f(tf["torch", n, "fp32"], "%.2f"), f(ms["ours", n, "tf32"], "%.2f"),
                       f(ms["torch", n, "tf32"], "%.2f"), ratio(ms["torch", n, "tf32"], ms["ours", n, "tf32"]),
                       f(mb["ours", n], "%.0f") "/" f(mb["torch", n], "%.0f"), f(ms["ours-launches", n, "fp32"], "%.2f"),
                       ratio(ms["ours-launches", n, "fp32"], ms["ours", n, "fp32"]), f(rpt["ours", n, "fp32"], "%.3f")
            }
            print "ours: each training step one CUDA graph (tfm_model_train_step); no graphs: launch by launch (tfm_cuda_set_graphs(0));"
            print "replayed: the share of the timed steps that replayed the last step'"'"'s graph (1 expected: the same batch every step)"
            if (has_fwd) {
                print "\nevaluation forward pass with the loss, ms (median; fp32, TF32 off)"
                printf "%-18s %9s %9s %7s   %9s %7s %8s\n", "config", "ours", "torch", "torch/", "no graphs", "nog/", "replayed"
                for (i = 1; i <= nn; i++) {
                    n = order[i]
                    printf "%-18s %9s %9s %7s   %9s %7s %8s\n", n, f(fms["ours", n], "%.3f"), f(fms["torch", n], "%.3f"),
                           ratio(fms["torch", n], fms["ours", n]), f(fms["ours-launches", n], "%.3f"),
                           ratio(fms["ours-launches", n], fms["ours", n]), f(frp["ours", n], "%.3f")
                }
                print "ours: tfm_model_forward, the model in evaluation mode, one CUDA graph; no graphs: launch by launch;"
                print "torch: model.eval() under torch.no_grad(); replayed: the share of the timed calls that replayed the last graph"
            }
            if (has_bf16) {
                print "\nbf16 training step, ms: ours cfg.precision bf16; torch autocast bf16 + SDPA, eager and torch.compile"
                printf "%-18s %9s %9s %9s %9s %7s %7s %7s   %9s %7s %9s %7s\n", "config", "ours", "torch", "torch", "speedup", "fastest/", "MFU", "MFU", "rounding", "rnd/", "mma.sync", "mma/"
                printf "%-18s %9s %9s %9s %9s %7s %7s %7s   %9s %7s %9s %7s\n", "", "bf16", "eager", "compile", "vs tf32", "ours", "ours", "torch", "bf16", "ours", "bf16", "ours"
                for (i = 1; i <= nn; i++) {
                    n = order[i]; best = ms["torch", n, "bf16"]
                    if (num(ms["torch", n, "bf16-compile"]) && (!num(best) || ms["torch", n, "bf16-compile"] + 0 < best + 0))
                        best = ms["torch", n, "bf16-compile"]
                    bm = mfu["torch", n, "bf16"]; if (mfu["torch", n, "bf16-compile"] + 0 > bm + 0) bm = mfu["torch", n, "bf16-compile"]
                    printf "%-18s %9s %9s %9s %9s %7s %7s %7s   %9s %7s %9s %7s\n", n, f(ms["ours", n, "bf16"], "%.2f"), f(ms["torch", n, "bf16"], "%.2f"),
                           f(ms["torch", n, "bf16-compile"], "%.2f"), ratio(ms["ours", n, "tf32"], ms["ours", n, "bf16"]),
                           ratio(best, ms["ours", n, "bf16"]), f(mfu["ours", n, "bf16"], "%.3f"), f(bm, "%.3f"),
                           f(ms["ours-bf16-rounding", n, "bf16"], "%.2f"), ratio(ms["ours-bf16-rounding", n, "bf16"], ms["ours", n, "bf16"]),
                           f(ms["ours-mma-sync", n, "bf16"], "%.2f"), ratio(ms["ours-mma-sync", n, "bf16"], ms["ours", n, "bf16"])
                }
                print "rounding: the same bf16 steps without bf16 activations (each product rounds its fp32 operands itself)"
                print "mma.sync: the same bf16 steps with the flash attention by mma.sync where a build for sm_90a runs wgmma (64- and 128-channel heads)"
            }
            print "\ngreedy generation, tokens/s (1-token prompts, up to 127 new tokens per row, fp32)"
            printf "%-18s %5s %11s %11s %11s %11s %9s %9s\n", "config", "batch", "ours", "torch", "ours/torch", "no graphs", "graphs/", "replayed"
            for (i = 1; i <= nn; i++) for (b = 1; b <= 32; b *= (b == 1 ? 8 : 4)) {
                n = order[i]
                printf "%-18s %5d %11s %11s %11s %11s %9s %9s\n", n, b, f(tok["ours", n, b], "%.0f"), f(tok["torch", n, b], "%.0f"),
                       ratio(tok["ours", n, b], tok["torch", n, b]), f(tok["ours-launches", n, b], "%.0f"),
                       ratio(tok["ours", n, b], tok["ours-launches", n, b]), (("ours", n, b) in rp) ? rp["ours", n, b] : "-"
            }
            print "ours: each decoding step one CUDA graph; no graphs: launch by launch (tfm_cuda_set_graphs(0));"
            print "replayed: the share of steps after a call'"'"'s first that replayed the last step'"'"'s graph (1 expected)"
            if (has_bf16_gen) {
                print "\nbf16 greedy generation at batch 1, tokens/s (cfg.precision bf16; graphs on)"
                printf "%-18s %11s %11s %9s %11s %11s\n", "config", "ours bf16", "rounding", "ours/rnd", "ours fp32", "bf16/fp32"
                for (i = 1; i <= nn; i++) {
                    n = order[i]
                    printf "%-18s %11s %11s %9s %11s %11s\n", n, f(tokb["ours", n], "%.0f"), f(tokb["ours-bf16-rounding", n], "%.0f"),
                           ratio(tokb["ours", n], tokb["ours-bf16-rounding", n]), f(tok["ours", n, 1], "%.0f"),
                           ratio(tokb["ours", n], tok["ours", n, 1])
                }
                print "ours bf16: the weights rounded to bf16 once a call; rounding: each product rounds its weight itself"
            }
            print "\nsame weights on CPU and GPU (our loss on the bench batch):"
            for (i = 1; i <= nn; i++) printf "  %-18s %s\n", order[i], (order[i] in check) ? check[order[i]] : "-"
            kernels()
            if (fails != "") print "\nfailures:" fails
            print "\nratios above 1: ours is faster. torch: eager PyTorch; tf32 columns: TF32 tensor cores on, both sides."
            print "MB: ours = the model'"'"'s block (tfm_model_memory_size; the GPU holds a twin), torch = max_memory_allocated."
        }' "$TMP/results.txt"
    elif [ "$SKIP_BENCH" = 1 ]; then
        echo "bench:   skipped (GPU_CHECK_SKIP_BENCH or GPU_CHECK_ONLY_TESTS)"
    fi
    for f in ${PROFILES[@]+"${PROFILES[@]}"}; do
        echo ""
        "$PYTHON" tools/ncu_summary.py "$f" 10
    done
    echo ""
    echo "total: $(elapsed) s; $([ "$FAILED" = 0 ] && echo 'every step passed' || echo 'SOME STEPS FAILED'); log: $LOG"
} | tee -a "$LOG"
rm -rf "$TMP"
exit "$FAILED"
