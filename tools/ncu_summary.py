#!/usr/bin/env python3
"""Where a GPU run's time goes, from `ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv`.

    python3 tools/ncu_summary.py FILE.csv [TOP]

Sums each kernel's time over its launches (kernels named without their argument lists, template
arguments kept), then prints the total and the TOP (default 12) largest with their share, launches and
mean time. tools/gpu_check.sh runs it over the profiles it takes; bench/runs/*-ncu-*.csv are such files.
"""
import csv
import io
import sys

UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def summarize(path, top):
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = list(csv.reader(io.StringIO("".join(l for l in f if l.startswith('"')))))
    if len(rows) < 2 or "Kernel Name" not in rows[0]:
        print("%s: no per-kernel summary (ncu did not finish?)" % path)
        return 1
    col = {h: i for i, h in enumerate(rows[0])}
    agg = {}
    for r in rows[1:]:
        if r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        name = r[col["Kernel Name"]]
        depth, cut = 0, len(name)
        for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0:
                cut = i
                break
        name = name[:cut].replace("void ", "").strip()
        n = int(r[col["Invocations"]].replace(",", ""))
        ns = float(r[col["Average"]].replace(",", "")) * UNIT_NS.get(r[col["Metric Unit"]], 1.0) * n
        a = agg.setdefault(name, [0.0, 0])
        a[0] += ns
        a[1] += n
    total = sum(a[0] for a in agg.values())
    print("%s: %.2f ms of kernels, %d launches" % (path, total / 1e6, sum(a[1] for a in agg.values())))
    for name, (ns, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        print("  %5.1f%% %9.3f ms %6d x %8.1f us  %s" % (100 * ns / total, ns / 1e6, n, ns / n / 1e3, name[:110]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12))
