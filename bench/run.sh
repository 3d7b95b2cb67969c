#!/usr/bin/env bash
# bench/run.sh - transformer.h against PyTorch on the reference models; prints one table per repeat.
#
# Builds nothing: run `make build/bench` first. Every measurement is its own process (so peak RSS is
# that model's alone), run one at a time. Environment:
#   CONFIGS="a b"   models to run (default: all; `build/bench list` names them)
#   THREADS="1 2"   thread counts (default 1 2)
#   REPEAT=2        how many times the whole table is measured (default 2; the machine is noisy)
#   QUICK=1         fewer repetitions everywhere: a smoke run whose numbers mean little
#   SGEMM=0         skip the sgemm rows (minutes: three engines on every shape); %sgemm stays empty
#   VERIFY=1        first check that each model computes the same function on both sides
#                   (build/bench dump + torch_ref.py verify: logits, loss, gradient norm, one step)
#   OURS_WAIT_POLICY=PASSIVE   OMP_WAIT_POLICY for our multi-thread rows too (default: libgomp's own,
#                   which spins; torch's multi-thread rows always run under PASSIVE, since torch runs
#                   an OpenMP pool beside OpenBLAS's pthread pool and the spinning one starves the other)
#   GEN=0           skip the generation rows (build/bench gen and torch_ref.py gen on the LMs: batch 1, 8
#                   and 32, the serving memory, the read bandwidth and batch 1's time against it)
#   GEN_CONFIGS="a" the LMs for those rows (default: every LM among CONFIGS)
#   BENCH=build/bench  PYTHON=/usr/bin/python3
#   TORCH2=path/to/python   a Python with torch 2.x (a venv with pip's torch): two more peers, torch 2.x
#                   eager and torch 2.x with torch.compile (torch_ref.py model NAME THREADS compile), run
#                   without OMP_WAIT_POLICY (PASSIVE slows torch 2.x down); then a second table per repeat
#                   sets ours beside all three and the fastest of them
#   SGEMM_CONFIG=name   time only this model's products beside square 2048 in the sgemm rows (shorter)
#   NICE=-19        run every measured process under `nice -n -19` (negative values need root): on a
#                   machine where other jobs keep running, they then get little of the cores during a
#                   measurement (both sides alike). The header says which value was used
#   BENCH_BUILTIN=build/bench-builtin   the bench built with BLAS=0 (make builds it beside a BLAS build):
#                   its training steps get a column of their own (the header's own sgemm: `make demo`'s speed)
# OPENBLAS_CORETYPE: OpenBLAS 0.3.21 (Debian 12) does not recognise recent Xeons and falls back to its
# generic "Prescott" kernels; when the CPU has AVX-512F and the variable is unset this script sets
# SkylakeX, for both sides (ours links the OpenMP build of the same OpenBLAS that torch uses).
set -u
cd "$(dirname "$0")/.." || exit 1

BENCH=${BENCH:-build/bench}
PY=${PYTHON:-/usr/bin/python3}
REPEAT=${REPEAT:-2}
THREADS=${THREADS:-"1 2"}
QUICK=${QUICK:-0}
SGEMM=${SGEMM:-1}
VERIFY=${VERIFY:-0}
OURS_WAIT_POLICY=${OURS_WAIT_POLICY:-}
GEN=${GEN:-1}
TORCH2=${TORCH2:-}
SGEMM_CONFIG=${SGEMM_CONFIG:-}
NICE=${NICE:-}
export QUICK

if [ ! -x "$BENCH" ]; then
    echo "run.sh: $BENCH not found: build it first (make build/bench)" >&2
    exit 1
fi
ALL_CONFIGS=$("$BENCH" list) || exit 1
CONFIGS=${CONFIGS:-$ALL_CONFIGS}
for c in $CONFIGS; do
    if ! printf '%s\n' $ALL_CONFIGS | grep -qx -- "$c"; then
        echo "run.sh: unknown config '$c' (known: $(echo $ALL_CONFIGS))" >&2
        exit 2
    fi
done

coretype_note="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} (from the environment)"
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=SkylakeX
    coretype_note="OPENBLAS_CORETYPE=SkylakeX set by run.sh for both sides (the CPU has avx512f; OpenBLAS 0.3.21 would pick Prescott)"
fi

BENCH_BUILTIN=${BENCH_BUILTIN:-build/bench-builtin}
HAVE_BUILTIN=0
if [ -x "$BENCH_BUILTIN" ] && ! "$BENCH" info | grep -q 'sgemm_backend=built-in'; then HAVE_BUILTIN=1; fi

HAVE_TORCH=0
if [ -x "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then HAVE_TORCH=1; fi
HAVE_TORCH2=0
if [ -n "$TORCH2" ]; then
    if "$TORCH2" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' >/dev/null 2>&1; then
        HAVE_TORCH2=1
    else
        echo "run.sh: TORCH2=$TORCH2 has no torch 2.x (\"$TORCH2 -c 'import torch'\" failed or found 1.x)" >&2
        exit 2
    fi
fi

cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
ours_info=$("$BENCH" info)
echo "== machine: cpu=\"${cpu:-?}\" cores=$(nproc) mem=$(awk '/MemTotal/ {printf "%.1fGB", $2/1048576}' /proc/meminfo) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
echo "== $coretype_note"
echo "== ours: $ours_info"
if [ "$HAVE_TORCH" = 1 ]; then
    echo "== torch: $("$PY" bench/torch_ref.py info)"
else
    echo "== torch: not available ($PY -c 'import torch' failed): torch columns stay empty"
fi
if [ "$HAVE_TORCH2" = 1 ]; then
    echo "== torch 2.x: $(env -u OMP_WAIT_POLICY "$TORCH2" bench/torch_ref.py info 2>/dev/null)"
    echo "== torch 2.x rows (eager and torch.compile) run without OMP_WAIT_POLICY; torch 1.13's multi-thread rows under PASSIVE"
fi
if [ -n "$NICE" ]; then echo "== every measured process runs under nice -n $NICE"; fi
echo "== configs: $(echo $CONFIGS)   threads: $THREADS   repeat: $REPEAT   quick: $QUICK"
if [ -n "$OURS_WAIT_POLICY" ]; then
    ours_wait="OMP_WAIT_POLICY=$OURS_WAIT_POLICY"
else
    ours_wait="the environment's OMP_WAIT_POLICY (${OMP_WAIT_POLICY:-unset: libgomp spins, then sleeps})"
fi
echo "== multi-thread rows: torch under OMP_WAIT_POLICY=PASSIVE, ours under $ours_wait"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tfm-bench.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# Run a command, echo its output, keep it in the repeat's result file.
run() {
    local out=$1
    shift
    local rc
    ${NICE:+nice -n "$NICE"} "$@" 2>&1 | tee -a "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then echo "run.sh: FAILED (exit $rc): $*" | tee -a "$out"; fi
}

if [ "$VERIFY" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
    echo "== verify: the same function on both sides"
    for c in $CONFIGS; do
        run "$TMP/verify" "$BENCH" dump "$c" "$TMP/dump.bin"
        run "$TMP/verify" "$PY" bench/torch_ref.py verify "$TMP/dump.bin"
        if [ "$HAVE_TORCH2" = 1 ]; then run "$TMP/verify" env -u OMP_WAIT_POLICY "$TORCH2" bench/torch_ref.py verify "$TMP/dump.bin"; fi
        rm -f "$TMP/dump.bin"
    done
fi

start=$(date +%s)
for r in $(seq 1 "$REPEAT"); do
    R="$TMP/repeat$r"
    : > "$R"
    echo "== repeat $r/$REPEAT  $(date '+%F %T')  load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
    if [ "$SGEMM" != 0 ]; then
        for t in $THREADS; do run "$R" "$BENCH" sgemm "$t" $SGEMM_CONFIG; done # built-in, OpenBLAS and BLIS side by side
    fi
    for c in $CONFIGS; do
        for t in $THREADS; do
            # BLIS (make BLAS=blis) takes its thread count from here only: tfm_set_num_threads does not reach it
            export BLIS_NUM_THREADS="$t"
            if [ "$t" -gt 1 ] && [ -n "$OURS_WAIT_POLICY" ]; then
                run "$R" env OMP_WAIT_POLICY="$OURS_WAIT_POLICY" "$BENCH" model "$c" "$t"
            else
                run "$R" "$BENCH" model "$c" "$t"
            fi
            if [ "$HAVE_BUILTIN" = 1 ]; then # the same model on the built-in sgemm, as impl=builtin
                run "$R" env ${OURS_WAIT_POLICY:+OMP_WAIT_POLICY=$OURS_WAIT_POLICY} bash -c \
                    '"$0" train "$1" "$2" | sed "s/^RESULT impl=ours /RESULT impl=builtin /"; exit ${PIPESTATUS[0]}' \
                    "$BENCH_BUILTIN" "$c" "$t"
            fi
            if [ "$HAVE_TORCH" = 1 ]; then
                if [ "$t" -gt 1 ]; then
                    run "$R" env OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_ref.py model "$c" "$t"
                else
                    run "$R" "$PY" bench/torch_ref.py model "$c" "$t"
                fi
            fi
            if [ "$HAVE_TORCH2" = 1 ]; then # torch 2.x eager (impl=torch2) and compiled (impl=torch2c)
                for mode in "" compile; do
                    run "$R" env -u OMP_WAIT_POLICY bash -c \
                        '"$0" bench/torch_ref.py model "$1" "$2" $3 | sed "s/ impl=torch-compile / impl=torch2c /; s/ impl=torch / impl=torch2 /"; exit ${PIPESTATUS[0]}' \
                        "$TORCH2" "$c" "$t" "$mode"
                done
            fi
        done
    done
    if [ "$GEN" != 0 ]; then # batched generation on the LMs, ours and torch's KV-cache loop
        for c in ${GEN_CONFIGS:-$CONFIGS}; do
            case " char-gpt-tiny gpt-small gpt2-124M-shape " in *" $c "*) ;; *) continue ;; esac
            for t in $THREADS; do
                run "$R" "$BENCH" gen "$c" "$t"
                if [ "$HAVE_TORCH" = 1 ]; then
                    if [ "$t" -gt 1 ]; then
                        run "$R" env OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_ref.py gen "$c" "$t"
                    else
                        run "$R" "$PY" bench/torch_ref.py gen "$c" "$t"
                    fi
                fi
            done
        done
    fi
    echo "LOAD repeat=$r end=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" >> "$R"
done

# The tables read a repeat's RESULT lines with this: v[impl, name, threads, key] = value (get() reads
# it, "" when absent); the sgemm rows give ceil[threads] (square 2048) and peak[threads] (FMA peak).
RESULTS_AWK='
    function get(impl, name, t, key,   k) { k = impl SUBSEP name SUBSEP t SUBSEP key; return (k in v) ? v[k] : "" }
    /^RESULT / {
        delete kv
        sg = 0
        for (i = 2; i <= NF; i++) {
            if ($i == "sgemm") { sg = 1; continue }
            p = index($i, "="); if (!p) continue
            kv[substr($i, 1, p - 1)] = substr($i, p + 1)
        }
        if (sg) { ceil[kv["threads"]] = kv["square2048_gflops"]; peak[kv["threads"]] = kv["fma_peak"]; next }
        for (k in kv) v[kv["impl"], kv["name"], kv["threads"], k] = kv[k]
    }'

# One table per repeat, from the RESULT lines.
table() {
    awk -v rep="$1" -v nrep="$REPEAT" -v configs="$CONFIGS" -v threads="$THREADS" "$RESULTS_AWK"'
    function num(x) { return x != "" && x + 0 >= 0 }
    function f1(x) { return num(x) ? sprintf("%.1f", x) : "-" }
    function fg(x) { return !num(x) ? "-" : (x < 10 ? sprintf("%.2f", x) : (x < 1000 ? sprintf("%.1f", x) : sprintf("%.0f", x))) }
    function pair(a, b) { return fg(a) "/" fg(b) }
    /^LOAD / { load = $0; sub(/^LOAD repeat=[0-9]+ /, "", load) }
    END {
        printf "\n== table, repeat %d/%d  (sgemm 2048 ceiling:", rep, nrep
        nt = split(threads, T, " ")
        for (i = 1; i <= nt; i++) printf " %s thr %s GFLOP/s%s", T[i], fg(ceil[T[i]]), i < nt ? "," : ""
        printf ")\n"
        hdr = sprintf("%-19s %3s %10s %10s %10s %7s %8s %7s %6s %15s %15s %13s", "config", "thr", "step ms", "step ms",
                      "torch ms", "torch/", "tok/s", "GFLOP/s", "%sgemm", "fwd ms", "peak MB", "gen ms/tok")
        print hdr
        printf "%-19s %3s %10s %10s %10s %7s %8s %7s %6s %15s %15s %13s\n", "", "", "ours", "built-in", "", "ours",
               "ours", "ours", "ours", "ours/torch", "ours/torch", "ours/torch"
        gsub(/./, "-", hdr); print hdr
        nc = split(configs, CF, " ")
        for (i = 1; i <= nc; i++) for (j = 1; j <= nt; j++) {
            c = CF[i]; t = T[j]
            so = get("ours", c, t, "step_ms"); st = get("torch", c, t, "step_ms")
            ratio = (num(so) && num(st) && so > 0) ? sprintf("%.2f", st / so) : "-"
            g = get("ours", c, t, "gflops")
            pct = (num(g) && num(ceil[t]) && ceil[t] > 0) ? sprintf("%.0f%%", 100 * g / ceil[t]) : "-"
            printf "%-19s %3s %10s %10s %10s %7s %8s %7s %6s %15s %15s %13s\n", c, t, f1(so),
                   f1(get("builtin", c, t, "step_ms")), f1(st), ratio,
                   fg(get("ours", c, t, "tok_s")), fg(g), pct,
                   pair(get("ours", c, t, "fwd_ms"), get("torch", c, t, "fwd_ms")),
                   pair(get("ours", c, t, "peak_mb"), get("torch", c, t, "peak_mb")),
                   pair(get("ours", c, t, "gen_ms_tok"), get("torch", c, t, "gen_ms_tok"))
        }
        if (load != "") printf "(load average at the end of this repeat: %s)\n", load
    }' "$TMP/repeat$1"
}

echo
echo "== results ($(( $(date +%s) - start )) s of measurement)"
echo "step ms built-in: the same training step with the header's own sgemm (build/bench-builtin, BLAS=0)."
echo "torch/ours > 1: we are faster. tok/s: B*T tokens per training step (enc-dec: B*(Ts+Tt)) / step time."
echo "GFLOP/s: FLOPs per step (bench/README.md) / step time; %sgemm: of the 2048x2048 sgemm measured above at"
echo "the same thread count. fwd: eval forward with loss. peak MB: ru_maxrss of the process (torch's includes"
echo "the Python interpreter and libtorch). gen: greedy batch-1 decoding with a KV cache, ms per new token."
# The generation table of one repeat, from the GEN, MEM, BW and RATIO lines.
gen_table() {
    awk -v rep="$1" '
    function kvs(   i, p) { delete kv; for (i = 2; i <= NF; i++) { p = index($i, "="); if (p) kv[substr($i, 1, p - 1)] = substr($i, p + 1) } }
    /^GEN / { kvs(); k = kv["name"] SUBSEP kv["threads"]; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
              tok[kv["impl"], k, kv["batch"]] = kv["tok_s"] }
    /^MEM / { kvs(); mem[kv["name"]] = sprintf("%s %s MB (formula %s, parameters %s), peak RSS %s MB", kv["name"], kv["model_mb"], kv["formula_mb"], kv["params_mb"], kv["peak_mb"]) }
    /^BW / { kvs(); bw[kv["threads"]] = kv["gb_s"] }
    /^RATIO / { kvs(); ratio[kv["name"] SUBSEP kv["threads"]] = kv["ms_tok"] " ms / " kv["read_ms"] " ms = " kv["ratio"] \
                " (from the 1 GiB rate: " kv["weights_ms"] " ms, " kv["ratio_bw"] ")" }
    END {
        if (!n) exit
        printf "\n== generation, repeat %d: greedy, 1-token prompts, 127 new tokens per row, tokens/s ours/torch (ours/torch)\n", rep
        printf "%-19s %3s %22s %22s %22s   %s\n", "config", "thr", "batch 1", "batch 8", "batch 32", "batch 1 ms/token / read weights once"
        for (i = 1; i <= n; i++) {
            split(order[i], a, SUBSEP)
            printf "%-19s %3s", a[1], a[2]
            for (b = 1; b <= 32; b *= (b == 1 ? 8 : 4)) {
                o = tok["ours", order[i], b]; t = tok["torch", order[i], b]
                printf " %22s", (o == "" ? "-" : o) "/" (t == "" ? "-" : t) ((o != "" && t > 0) ? sprintf(" (%.2f)", o / t) : "")
            }
            printf "   %s\n", (order[i] in ratio) ? ratio[order[i]] : "-"
        }
        for (t in bw) printf "read bandwidth, %s thread(s): %s GB/s (1 GiB summed with vector loads)\n", t, bw[t]
        for (c in mem) printf "serving memory (inference_only, max_batch 32): %s\n", mem[c]
    }' "$TMP/repeat$1"
}

# With torch 2.x: ours beside the three PyTorch peers, the FMA peak, the sgemm rate and attention's share.
peer_table() {
    awk -v rep="$1" -v nrep="$REPEAT" -v configs="$CONFIGS" -v threads="$THREADS" "$RESULTS_AWK"'
    function num(x) { return x != "" && x + 0 > 0 }
    function f1(x) { return num(x) ? sprintf("%.1f", x) : "-" }
    function f0(x) { return num(x) ? sprintf("%.0f", x) : "-" }
    function pct(a, b) { return (num(a) && num(b)) ? sprintf("%.0f%%", 100 * a / b) : "-" }
    function ratio(a, b) { return (num(a) && num(b)) ? sprintf("%.2f", a / b) : "-" }
    END {
        printf "\n== ours beside torch 1.13, torch 2.x eager and torch 2.x compiled, repeat %d/%d (FMA peak:", rep, nrep
        nt = split(threads, T, " ")
        for (i = 1; i <= nt; i++) printf " %s thr %s GFLOP/s%s", T[i], f1(peak[T[i]]), i < nt ? "," : ""
        printf ")\n"
        hdr = sprintf("%-19s %3s %9s %9s %9s %9s %8s %6s %7s %6s %19s %26s", "config", "thr", "ours ms", "1.13 ms",
                      "2.x ms", "2.x-c ms", "fastest/", "%peak", "%sgemm", "attn", "peak MB", "loss after training")
        print hdr
        printf "%-19s %3s %9s %9s %9s %9s %8s %6s %7s %6s %19s %26s\n", "", "", "", "", "eager", "compiled", "ours",
               "ours", "ours", "share", "ours/1.13/2.x/2.x-c", "1.13 / 2.x / 2.x-c"
        gsub(/./, "-", hdr); print hdr
        nc = split(configs, CF, " ")
        for (i = 1; i <= nc; i++) for (j = 1; j <= nt; j++) {
            c = CF[i]; t = T[j]
            so = get("ours", c, t, "step_ms"); s1 = get("torch", c, t, "step_ms")
            s2 = get("torch2", c, t, "step_ms"); s3 = get("torch2c", c, t, "step_ms")
            best = ""
            if (num(s1)) best = s1
            if (num(s2) && (best == "" || s2 + 0 < best + 0)) best = s2
            if (num(s3) && (best == "" || s3 + 0 < best + 0)) best = s3
            g = get("ours", c, t, "gflops")
            printf "%-19s %3s %9s %9s %9s %9s %8s %6s %7s %6s %19s %26s\n", c, t, f1(so), f1(s1), f1(s2), f1(s3),
                   ratio(best, so), pct(g, peak[t]), pct(g, ceil[t]), pct(get("ours", c, t, "attn_ms"), so),
                   f0(get("ours", c, t, "peak_mb")) "/" f0(get("torch", c, t, "peak_mb")) "/" \
                   f0(get("torch2", c, t, "peak_mb")) "/" f0(get("torch2c", c, t, "peak_mb")),
                   get("torch", c, t, "loss") " / " get("torch2", c, t, "loss") " / " get("torch2c", c, t, "loss")
        }
    }' "$TMP/repeat$1"
}

for r in $(seq 1 "$REPEAT"); do
    table "$r"
    if [ "$HAVE_TORCH2" = 1 ]; then peer_table "$r"; fi
    gen_table "$r"
done
if [ "$HAVE_TORCH2" = 1 ]; then
    echo
    echo "fastest/ours: the fastest of the three PyTorch steps over ours (above 1: we are faster). %peak: our GFLOP/s"
    echo "of the FMA peak, %sgemm: of square 2048 through tfm_sgemm, both measured in the sgemm rows of the same repeat."
    echo "attn share: tfm_attention_forward + _backward at the model's attention shapes, timed apart, over our step."
    echo "loss after training: the eval loss after the same training steps from the same initialisation (torch"
    echo "versions must agree: the same model); 2.x-c: the forward and loss under torch.compile, AdamW eager."
fi
