#!/usr/bin/env python3
"""Where one forward step's time goes, from Nsight Compute's per-kernel durations.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        deltaserve bench batch ... > step.csv
    step_profile.py step.csv [--first-kernel embed] [--markdown]

ncu runs every kernel of the process alone (no overlap, no launch gaps), so the sum is the
step's GPU time without the gaps between kernels. The step: the kernels from the last launch
whose name contains --first-kernel (a step's first kernel: the token embedding, gemv_embed_*)
to the end of the profile, so the profiled program should end with the step of interest (bench
batch: its last decode step; bench decode: its last token or verify run). Kernels are grouped
by their function name (template arguments and parameters dropped); printed: launches, total
microseconds and share of the step, the largest first, then the step's total.
"""
import argparse
import csv
import re
import sys

# the duration units ncu writes: "nsecond" and so on, or "ns" and so on (Nsight Compute 2025)
UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
         "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def kernels(lines):
    """(name, microseconds) per kernel launch, in launch order, from ncu's --csv output."""
    rows = [l for l in lines if l.startswith('"')]  # ncu's own log lines are not quoted
    out = []
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "")
        if unit not in UNITS:
            raise ValueError("unknown unit %r for kernel %s" % (unit, r.get("ID")))
        value = float(r["Metric Value"].replace(",", ""))
        out.append((int(r["ID"]), r["Kernel Name"], value * UNITS[unit]))
    out.sort()
    return [(name, us) for _, name, us in out]


def base_name(name):
    """The kernel's function name: 'void f<T, 4>(const float *, int)' -> 'f'."""
    n = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(n)
    for i, ch in enumerate(n):  # the first '<' or '(' at depth 0 ends the name
        if ch in "<(" and depth == 0:
            cut = i
            break
    n = n[:cut]
    return n.split("::")[-1] or name


def last_step(ks, first):
    starts = [i for i, (name, _) in enumerate(ks) if first in name]
    if not starts:
        raise ValueError("no kernel named like %r in the profile (%d kernels)" % (first, len(ks)))
    return ks[starts[-1]:]


def table(step):
    groups = {}
    for name, us in step:
        g = groups.setdefault(base_name(name), [0, 0.0])
        g[0] += 1
        g[1] += us
    total = sum(us for _, us in step)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return total, [(name, n, us, 100.0 * us / total if total else 0.0) for name, (n, us) in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--first-kernel", default="embed")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        ks = kernels(f.read().splitlines())
    try:
        step = last_step(ks, a.first_kernel)
    except ValueError as e:
        sys.exit("step_profile: %s" % e)
    total, rows = table(step)
    if a.markdown:
        print("| kernel | launches | µs | share |")
        print("|---|---|---|---|")
        for name, n, us, share in rows:
            print("| %s | %d | %.1f | %.1f%% |" % (name, n, us, share))
        print("| **step** | %d | **%.1f** | 100%% |" % (len(step), total))
    else:
        for name, n, us, share in rows:
            print("%-40s %6d %10.1f us %5.1f%%" % (name, n, us, share))
        print("step: %d kernels, %.1f us" % (len(step), total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
