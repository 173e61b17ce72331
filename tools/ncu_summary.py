#!/usr/bin/env python3
"""Summarises an `ncu --csv --page raw` log of a decode run: per kernel name, launches, total and
mean duration, DRAM bytes read and achieved GB/s; then totals per token (divide by --tokens).

    tools/ncu_summary.py ncu.csv TOKENS
"""
import csv
import sys


def main():
    path, tokens = sys.argv[1], int(sys.argv[2])
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    head = next(rd)
    units = next(rd)
    col = {h: i for i, h in enumerate(head)}
    for r in rd:
        try:
            name = r[col["Kernel Name"]]
            t = float(r[col["gpu__time_duration.sum"]].replace(",", ""))
            b = float(r[col["dram__bytes_read.sum"]].replace(",", "")) if "dram__bytes_read.sum" in col else 0.0
            grid = r[col["Grid Size"]] if "Grid Size" in col else ""
            blk = r[col["Block Size"]] if "Block Size" in col else ""
        except (KeyError, ValueError, IndexError):
            continue
        rows.append((name.split("(")[0].split("<")[0], name, t, b, grid, blk))
    tu = units[col["gpu__time_duration.sum"]]
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "nsecond": 1e-3}.get(tu, 1e-3)
    agg = {}
    for short, name, t, b, grid, blk in rows:
        key = short
        a = agg.setdefault(key, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += t * scale
        a[2] += b
    tot_t = sum(a[1] for a in agg.values())
    tot_b = sum(a[2] for a in agg.values())
    print(f"{len(rows)} kernels profiled ({len(rows) / tokens:.0f} per token); sum of durations "
          f"{tot_t / tokens:.1f} us/token, DRAM read {tot_b / tokens / 1e9:.3f} GB/token "
          f"({tot_b / (tot_t * 1e-6) / 1e9 if tot_t else 0:.0f} GB/s while kernels run)")
    print(f"{'kernel':32s} {'n/tok':>6s} {'us/tok':>9s} {'mean us':>8s} {'MB/tok':>9s} {'GB/s':>7s}")
    for k, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{k[:32]:32s} {n / tokens:6.1f} {t / tokens:9.1f} {t / n:8.2f} {b / tokens / 1e6:9.2f} "
              f"{b / (t * 1e-6) / 1e9 if t else 0:7.0f}")
    # the largest single launches with their grids (one token)
    print("slowest launches:")
    for short, name, t, b, grid, blk in sorted(rows, key=lambda r: -r[2])[:12]:
        print(f"  {t * scale:8.2f} us {b / 1e6:8.2f} MB {b / (t * scale * 1e-6) / 1e9 if t else 0:6.0f} GB/s grid {grid} block {blk} {name[:90]}")


if __name__ == "__main__":
    main()
