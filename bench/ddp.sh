#!/usr/bin/env bash
# bench/ddp.sh - data-parallel training speed in one run: for char-gpt-tiny and gpt-small, one process
# of 2 threads (1x2) against 2 processes of one thread (2x1) on the same global batch, alternating,
# REPS times each (default 3); prints the medians and the 2x1/1x2 throughput ratio. Run it on a quiet
# machine (nothing else running):  make build/bench-ddp && bash bench/ddp.sh
# Processes are not pinned (--bind-to none), as the one process's two OpenMP threads are not.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/bench-ddp
reps=${REPS:-3}
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for name in char-gpt-tiny gpt-small; do
    steps=20
    [ "$name" = gpt-small ] && steps=8
    for ((r = 0; r < reps; r++)); do
        mpirun "${flags[@]}" -np 1 "$bin" "$name" 2 "$steps" | grep '^RESULT' | tee -a "$out"
        mpirun "${flags[@]}" -np 2 "$bin" "$name" 1 "$steps" | grep '^RESULT' | tee -a "$out"
    done
done
echo
awk '
function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                 return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  k = v["name"] SUBSEP v["procs"]; n[k]++; st[k, n[k]] = v["step_ms"]; ar[k, n[k]] = v["allreduce_ms"];
  pu[k, n[k]] = v["pure_ms"]; tk[k, n[k]] = v["tok_s"]; mb[v["name"]] = v["grad_mb"]; names[v["name"]] = 1 }
END {
  printf "%-14s %6s %10s %10s %13s %10s %8s %11s\n", "model", "layout", "step ms", "tokens/s", "all-reduce ms", "pure ms", "share", "2x1 / 1x2"
  split("char-gpt-tiny gpt-small", order, " ")
  for (o = 1; o <= 2; o++) { nm = order[o]; if (!(nm in names)) continue
    for (p = 1; p <= 2; p++) { k = nm SUBSEP p; c = n[k]
      for (i = 1; i <= c; i++) { a1[i] = st[k, i]; a2[i] = ar[k, i]; a3[i] = pu[k, i]; a4[i] = tk[k, i] }
      s = med(a1, c); r = med(a2, c); q = med(a3, c); t = med(a4, c); tok[p] = t
      printf "%-14s %6s %10.1f %10.0f %13.1f %10.1f %7.1f%% %11s\n", nm, (p == 1 ? "1x2" : "2x1"), s, t, r, q,
             100 * q / s, (p == 2 ? sprintf("%.2f", tok[2] / tok[1]) : "") }
    printf "%-14s gradient: %.1f MiB per step, medians of %d runs\n", "", mb[nm], c }
}' "$out"
