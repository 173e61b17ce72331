#!/usr/bin/env python3
"""The last decode token of an `ncu --csv --page raw` log (tools/gpu-test.d/90-profile.sh), kernel
by kernel in launch order (template arguments kept: EP and rows per warp tell GEMVs apart), then
the same token summed per kernel: launches, microseconds, MB read from DRAM.

    tools/ncu_seq.py ncu.csv

ncu serialises the kernels and flushes the caches before each, so small kernels read longer
than they take inside the step graph; the comparison between two graphs is what it is for."""
import collections
import csv
import sys

SCALE_T = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
           "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}  # older ncu spells units out
SCALE_B = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}


def short(name):
    head = name.replace("(anonymous namespace)::", "")
    cut = head.find(">(")
    return head[:cut + 1] if cut >= 0 else head.split("(")[0]


def main():
    lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
    rd = csv.reader(lines)
    head = next(rd)
    units = next(rd)
    col = {h: i for i, h in enumerate(head)}
    ts = SCALE_T[units[col["gpu__time_duration.sum"]]]
    bs = SCALE_B.get(units[col["dram__bytes_read.sum"]], 1e-6)
    rows = []
    for r in rd:
        try:
            rows.append((short(r[col["Kernel Name"]]), r[col.get("Grid Size", 0)] if "Grid Size" in col else "",
                         float(r[col["gpu__time_duration.sum"]].replace(",", "")) * ts,
                         float(r[col["dram__bytes_read.sum"]].replace(",", "")) * bs))
        except (KeyError, ValueError, IndexError):
            continue
    starts = [i for i, r in enumerate(rows) if r[0].startswith("embed_step")]
    if not starts:
        sys.exit("ncu_seq: no embed_step kernel (no decode token) in " + sys.argv[1])
    tok = rows[starts[-1]:]
    for i, (n, g, us, mb) in enumerate(tok):
        print("%4d %-52.52s %14s %9.2f us %9.3f MB" % (i, n, g, us, mb))
    agg = collections.OrderedDict()
    for n, g, us, mb in tok:
        a = agg.setdefault((n, g), [0, 0.0, 0.0])
        a[0] += 1
        a[1] += us
        a[2] += mb
    print("\nper kernel, this token:")
    for (n, g), (k, us, mb) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("%-52.52s %14s %4d %9.1f us %9.1f MB" % (n, g, k, us, mb))
    print("total: %d kernels, %.1f us, %.1f MB" % (len(tok), sum(r[2] for r in tok), sum(r[3] for r in tok)))


if __name__ == "__main__":
    main()
