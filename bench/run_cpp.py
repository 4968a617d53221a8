#!/usr/bin/env python3
"""Run the C++ benchmarks and write bench/results/cpp.md (linked from README.md and the manual).

    python bench/run_cpp.py build            # build dir holding bench/*_benchmark
    python bench/run_cpp.py build --min-time 0.5 --out bench/results/cpp.md

Each Google Benchmark program reports bytes/s next to a plain memcpy of the
same bytes in the same run; the table keeps items/s and GB/s and the ratio to
that run's memcpy row.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

PROGRAMS = ["reader_benchmark", "sampler_benchmark", "volume_benchmark"]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--min-time", default="0.5")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cpp.md"))
    args = ap.parse_args()
    lines = [
        "### C++ hot paths (Google Benchmark, page cache warm)",
        "",
        f"{datetime.date.today().isoformat()}, {cpu_model()}, {os.cpu_count()} cores; "
        f"`python bench/run_cpp.py {args.build}`; median of {args.repetitions} repetitions. "
        "Each program's memcpy row copies the same number of bytes per item from random places in a buffer "
        "as large as the data, in the same run.",
        "",
        "| benchmark | items/s | GB/s | vs memcpy |",
        "|---|---:|---:|---:|",
    ]
    for prog in PROGRAMS:
        exe = os.path.join(args.build, "bench", prog)
        if not os.path.exists(exe):
            lines.append(f"| {prog} | not built | | |")
            continue
        out = subprocess.run([exe, f"--benchmark_min_time={args.min_time}",
                              f"--benchmark_repetitions={args.repetitions}",
                              "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                             capture_output=True, text=True, check=True).stdout
        rows = [b for b in json.loads(out)["benchmarks"] if b.get("aggregate_name") == "median"]
        memcpys = {b["run_name"].split("/")[1] if "/" in b["run_name"] else "": b
                   for b in rows if "Memcpy" in b["run_name"]}
        for b in rows:
            gbps = b.get("bytes_per_second", 0) / 1e9
            ratio = ""
            parts = b["run_name"].split("/")
            memcpy = memcpys.get(parts[1] if len(parts) > 1 else "") or next(iter(memcpys.values()), None)
            if memcpy and gbps and "Memcpy" not in b["run_name"]:
                ratio = f"{gbps / (memcpy['bytes_per_second'] / 1e9):.2f}x"
            items = b.get("items_per_second", 0)
            lines.append(f"| {prog}: `{b['run_name']}` | {items:,.0f} | {gbps:.2f} | {ratio} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    open(args.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
