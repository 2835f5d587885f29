#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Collect the results of one `make bench` run into one table and one JSON file.

usage: report.py --console LOG --output LOG --cargo LOG --check-log FILE --kernel-dir DIR
                 --kind bench|test --run-kernel-dir DIR --json OUT --wall SECONDS

Rows come from `NU-BENCH {json}` lines (the KUnit bench suite in the guest's console log, and
udma_bench in the guest command's output; the first row of each name counts), from the two
`udmactl bench` tables in the output (user queue, then --memcpy), from `cargo bench` of udma-sim
(model copy loop vs memcpy) and from the `make check` wall times that scripts/check appends to
check-times.log. Every row has name, value, unit, baseline, ratio (value / baseline) and how.
Some rows are derived from others of the same run (TARGETS' rows whose baseline is another row).
Rows named in TARGETS get a target, labelled by what it measures (TARGET_KINDS), and "met" or
"MISSED"; for each missed row the profile of its workload (`NU-PROFILE-BEGIN name` .. `NU-PROFILE-END name` in the
output, perf report of perf record -e cpu-clock) is printed after the table. Exit status 1 if an
expected group of rows is missing (a missed target is reported, not an error).
"""

import argparse
import datetime
import json
import os
import platform
import re
import sys

BENCH_RE = re.compile(r"NU-BENCH (\{.*\})\s*$")
RATE_RE = r"([\d.]+) (GB|MB|kB)/s"
UDMACTL_RE = re.compile(r"^\s*(\S+)\s+(host->host|host->HBM|HBM->host)\s+" + RATE_RE + r"\s+" + RATE_RE)
ZC_RE = re.compile(r"^\s*(\S+)\s+zero-copy (host->HBM|HBM->host)\s+" + RATE_RE + r"\s+" + RATE_RE
                   + r"\s+[\d.]+x\s+([\d.]+)ms\s+(\d+)")
UNIT = {"GB": 1e9, "MB": 1e6, "kB": 1e3}


# What each target measures: its label in the table, (a) .. (e) and (zc), as in
# Documentation/benchmarks.rst, "Targets".
TARGET_KINDS = {
    "a": "pair build",
    "b": "COPY_PREPARE per pair",
    "c": "small-copy latency",
    "d": "streaming",
    "e": "two threads",
    "zc": "zero-copy",
}
# Targeted rows: name -> (kind of TARGET_KINDS, comparison, ratio bound, profile of its workload).
TARGETS = {
    "prepare_one vs C reference (in kernel)": ("a", "<=", 0.8, "kernel"),
    "COPY_PREPARE x256 time per pair": ("b", "<=", 3.0, "submit"),
    "COPY_PREPARE x2032 time per pair": ("b", "<=", 3.0, "submit"),
    "COPY_PREPARE x256 per pair, 1000 buffers open": ("b", "<=", 1.1, "lookup"),
    "latency 4 B copy p50 vs floor": ("c", "<=", 1.5, "latency"),
    "latency 4 B copy p99 vs p50": ("c", "<=", 3.0, "latency"),
    "streaming 64M host->HBM: user queue vs MEMCPY": ("d", ">=", 0.9, "stream"),
    "streaming 64M HBM->host: user queue vs MEMCPY": ("d", ">=", 0.9, "stream"),
    "submit PREPARE x16, 2 threads": ("e", ">=", 1.8, "threads"),
    "submit PREPARE x256, 2 threads": ("e", ">=", 1.8, "threads"),
    "submit PREPARE x2032, 2 threads": ("e", ">=", 1.8, "threads"),
    # Zero-copy (MEM_IMPORT) against the copy into a coherent buffer + DMA.
    "zero-copy 64M host->HBM (user queue)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M HBM->host (user queue)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M host->HBM (MEMCPY)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M HBM->host (MEMCPY)": ("zc", ">=", 1.5, "zerocopy"),
}
# Doorbell writes one small copy must make: Rx then Tx, once (data pair and marker pair share
# them: COPY_WAIT rings both rings once for everything prepared).
DOORBELL_WRITES = 2


def bench_lines(path):
    rows, seen = [], set()
    with open(path, errors="replace") as f:
        for line in f:
            m = BENCH_RE.search(line.replace("\r", ""))
            if m:
                try:
                    row = json.loads(m.group(1))
                except json.JSONDecodeError as e:
                    print(f"report: bad NU-BENCH line in {path}: {e}", file=sys.stderr)
                    continue
                if row["name"] not in seen:
                    seen.add(row["name"])
                    rows.append(row)
    return rows


def profiles(path):
    """`NU-PROFILE-BEGIN name: command` .. `NU-PROFILE-END name` sections of the output."""
    out, cur = {}, None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.replace("\r", "").rstrip("\n")
            m = re.match(r"NU-PROFILE-BEGIN (\S+): (.*)", line)
            if m:
                cur = m.group(1)
                out[cur] = {"command": m.group(2), "lines": []}
            elif line.startswith("NU-PROFILE-END"):
                cur = None
            elif cur:
                out[cur]["lines"].append(line)
    return out


def derive(rows):
    """Rows whose baseline comes from another row of the same run (targets (b) to (d))."""
    by = {r["name"]: r for r in rows}
    new = []
    prep = by.get("prepare_one (in kernel)")
    for r in rows:
        if r["name"].startswith("COPY_PREPARE x") and r["name"].endswith("time per pair") and prep:
            r["baseline"] = prep["value"]
            r["ratio"] = r["value"] / prep["value"] if prep["value"] else 0
    lat, mmio = by.get("latency 4 B copy p50"), by.get("BAR0 doorbell-sized write (in kernel)")
    if lat and mmio:
        floor = lat["baseline"] + DOORBELL_WRITES * mmio["value"] / 1000
        new.append({"name": "latency 4 B copy p50 vs floor", "value": lat["value"], "unit": "us",
                    "baseline": floor, "ratio": lat["value"] / floor if floor else 0,
                    "how": f"the latency p50 above; baseline (floor): the null ioctl p50 "
                           f"({lat['baseline']:.2f} us) + {DOORBELL_WRITES} doorbell-sized BAR0 "
                           f"writes ({mmio['value'] / 1000:.2f} us each, KUnit bench suite): the "
                           f"Rx and Tx doorbells the copy must ring"})
    for d in ("host->HBM", "HBM->host"):
        uq, mc = by.get(f"user queue 64M {d}"), by.get(f"MEMCPY 64M {d}")
        if uq and mc:
            new.append({"name": f"streaming 64M {d}: user queue vs MEMCPY", "value": uq["value"],
                        "unit": "B/s", "baseline": mc["value"],
                        "ratio": uq["value"] / mc["value"] if mc["value"] else 0,
                        "how": "udmactl bench --pipeline --sizes 64M through two user queues "
                               "(neuron_udma::Pipeline: the next batch is prepared and started "
                               "while the engine runs the previous one); baseline: udmactl bench "
                               "--memcpy (the MEMCPY ioctl) of the same run"})
    return new


def judge(rows):
    for r in rows:
        t = TARGETS.get(r["name"])
        if not t:
            continue
        kind, op, bound, prof = t
        ok = r["ratio"] <= bound if op == "<=" else r["ratio"] >= bound
        r.update({"target": f"({kind}) {op} {bound:g}x", "met": bool(ok and r["baseline"]),
                  "profile": prof})


def udmactl_rows(path):
    """The `udmactl bench` tables: the first without --memcpy (user queue), then MEMCPY."""
    rows, via = [], None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.replace("\r", "")
            if "size" in line and "via" in line:
                # The zero-copy tables (zc_rows) have rows of their own format.
                if "zero-copy" in line:
                    via = None
                    continue
                via = "MEMCPY" if "via MEMCPY" in line else "user queue"
                ring = re.search(r"via (.*)$", line).group(1).strip()
                continue
            m = UDMACTL_RE.match(line)
            if not m or via is None:
                continue
            size, path_, v, vu, b, bu = m.groups()
            value, base = float(v) * UNIT[vu], float(b) * UNIT[bu]
            how = (f"udmactl bench{' --memcpy' if via == 'MEMCPY' else ' --pipeline'} --iters 3 --sizes "
                   f"4K,64K,1M,64M: best of 3; sizes above 4 MiB move in 4 MiB rounds (host buffers are "
                   f"at most 4 MiB), via {ring}; baseline: guest memcpy of the same bytes (best of 3)")
            rows.append({"name": f"{via} {size} {path_}", "value": value, "unit": "B/s",
                         "baseline": base, "ratio": value / base if base else 0, "how": how})
    return rows


def zc_rows(path):
    """The `udmactl bench --zero-copy` tables: zero-copy against copy-into-coherent."""
    rows, via = [], None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.replace("\r", "")
            if "size" in line and "via" in line:
                via = None
                if "zero-copy" in line:
                    via = "MEMCPY" if "via MEMCPY" in line else "user queue"
                    ring = re.search(r"via (.*)$", line).group(1).strip()
                continue
            m = ZC_RE.match(line)
            if not m or via is None:
                continue
            size, path_, v, vu, b, bu, pin, runs = m.groups()
            value, base = float(v) * UNIT[vu], float(b) * UNIT[bu]
            opt = "--memcpy" if via == "MEMCPY" else "--pipeline"
            how = (f"udmactl bench --zero-copy {opt}: the process's own {size} buffer imported "
                   f"(MEM_IMPORT; {'read-only' if path_ == 'host->HBM' else 'IMPORT_WRITE'}), copied "
                   f"via {ring}, freed, import and free timed with it (pin_ms: their part in the best run; "
                   f"runs: the import's physically contiguous runs, each boundary a copy crosses "
                   f"costs one more descriptor pair); "
                   f"baseline: the same bytes through a 4 MiB coherent host buffer, a CPU memcpy "
                   f"between it and the process buffer per 4 MiB round plus the DMA; best of 3 each")
            rows.append({"name": f"zero-copy {size} {path_} ({via})", "value": value, "unit": "B/s",
                         "baseline": base, "ratio": value / base if base else 0, "how": how,
                         "pin_ms": float(pin), "runs": int(runs)})
    return rows


def cargo_rows(path):
    text = open(path, errors="replace").read()
    model = re.search(r"model :\s+([\d.]+) s\s+([\d.]+) GB/s", text)
    memcpy = re.search(r"memcpy:\s+([\d.]+) s\s+([\d.]+) GB/s", text)
    what = re.search(r"copied (.*)", text)
    if not model or not memcpy:
        return []
    value, base = float(model.group(2)) * 1e9, float(memcpy.group(2)) * 1e9
    return [{"name": "udma-sim copy loop (host)", "value": value, "unit": "B/s", "baseline": base,
             "ratio": value / base,
             "how": f"cargo bench -p udma-sim --bench copy_bench on the host: {what.group(1) if what else '1 GiB'}, "
                    f"in-process model, no QEMU; baseline: host memcpy of the same 64 KiB chunks"}]


def kernel_rows(kind, run_kdir, test_kdir):
    """Cold build time of the kernel that ran (and of the test kernel, as its baseline)."""
    def secs(d):
        try:
            return int(open(os.path.join(d, ".build-seconds")).read().strip())
        except (OSError, ValueError):
            return 0
    run, test = secs(run_kdir), secs(test_kdir)
    if not run:
        return []
    return [{"name": f"{kind} kernel build, cold", "value": run, "unit": "s", "baseline": test,
             "ratio": run / test if test else 0,
             "how": f"{run_kdir}/.build-seconds (scripts/build-kernel --kind {kind}: allnoconfig + "
                    f"fragment, LLVM=1, -j$(nproc), on the shared machine); baseline: the test "
                    f"kernel's cold build"}]


def check_rows(path, kernel_dir):
    """Cold and warm `make check` from check-times.log (`DATE SECS s rc=N [cold|warm]`)."""
    runs = []
    try:
        for line in open(path):
            m = re.match(r"(\S+) (\d+) s rc=(\d+)(?: (cold|warm))?", line)
            if m:
                runs.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    except FileNotFoundError:
        return []
    ok = [r for r in runs if r[2] == 0]
    if not ok:
        return []
    tagged_cold = [r for r in ok if r[3] == "cold"]
    tagged_warm = [r for r in ok if r[3] == "warm"]
    if tagged_warm:
        warm, warm_how = tagged_warm[-1], f"latest warm-tagged passing run, {tagged_warm[-1][0]}"
    else:
        by_time = sorted(ok, key=lambda r: r[1])
        warm = by_time[(len(by_time) - 1) // 2]
        warm_how = f"median of the {len(ok)} passing runs in the log (untagged), e.g. {warm[0]}"
    if tagged_cold:
        cold, cold_how = tagged_cold[-1], "latest run tagged cold"
    else:
        cold = max(ok, key=lambda r: r[1])
        cold_how = ("slowest passing run in the log (the log does not tag cold runs; "
                    "a really cold run also builds the toolchain root and the kernel)")
    kernel = ""
    try:
        kernel = f"; the cached test kernel took {open(os.path.join(kernel_dir, '.build-seconds')).read().strip()} s to build"
    except OSError:
        pass
    return [
        {"name": "make check, cold", "value": cold[1], "unit": "s", "baseline": warm[1],
         "ratio": cold[1] / warm[1] if warm[1] else 0,
         "how": f"{path}: {cold_how}, {cold[0]}{kernel}; baseline: warm run"},
        {"name": "make check, warm", "value": warm[1], "unit": "s", "baseline": warm[1], "ratio": 1.0,
         "how": f"{path}: {warm_how} ({len(runs)} runs recorded, {len(ok)} passing; other sessions "
                f"may have run concurrently on the same machine)"},
    ]


def fmt(v, unit):
    if unit == "B/s":
        for div, u in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if v >= div:
                return f"{v / div:.2f} {u}"
        return f"{v:.0f} B/s"
    if unit == "pairs/s":
        return f"{v:,.0f} pairs/s"
    return f"{v:.3f} {unit}" if isinstance(v, float) and v < 100 else f"{v:.1f} {unit}" if isinstance(v, float) else f"{v} {unit}"


KERNELS = {
    "bench": "bench kernel (production config, tests/kernel-bench.config: no KASAN, lockdep, "
             "kmemleak, DEBUG_*, DMA-API debug, Rust overflow checks or debug assertions; perf events)",
    "test": "debug test kernel (tests/kernel.config: KASAN, lockdep, kmemleak, DEBUG_OBJECTS, "
            "DMA-API debug, Rust overflow checks and debug assertions)",
}


def machine(kind="test"):
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
        mem = f", {kb / 1048576:.1f} GiB RAM"
    except (OSError, AttributeError):
        pass
    load = ""
    try:
        load = ", load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        pass
    return (f"host: {os.cpu_count()} x {cpu}{mem}, Linux {platform.release()}{load}; guest: QEMU TCG "
            f"(-cpu max), 2 vCPUs, 512 MiB, {KERNELS.get(kind, kind)}; "
            f"device: udma-sim trn1 model over vfio-user, 256 MiB HBM")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--console", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--cargo", required=True)
    ap.add_argument("--check-log", required=True)
    ap.add_argument("--kernel-dir", default="", help="the test kernel (make check rows)")
    ap.add_argument("--kind", default="test", choices=("bench", "test"), help="the kernel that ran")
    ap.add_argument("--run-kernel-dir", default="", help="build dir of the kernel that ran")
    ap.add_argument("--json", required=True)
    ap.add_argument("--wall", type=int, default=0)
    a = ap.parse_args()

    groups = [
        ("1. descriptor pair build (KUnit)", bench_lines(a.console)),
        ("2+4. submission rate and latency (udma_bench)", bench_lines(a.output)),
        ("3. copy throughput (udmactl bench)", udmactl_rows(a.output)),
        ("6. zero-copy (udmactl bench --zero-copy)", zc_rows(a.output)),
        ("3. model copy loop (cargo bench)", cargo_rows(a.cargo)),
        ("5. build and test cost", kernel_rows(a.kind, a.run_kernel_dir, a.kernel_dir)
         + check_rows(a.check_log, a.kernel_dir)),
    ]
    missing = [g for g, rows in groups if not rows]
    rows = [r for _, rs in groups for r in rs]
    rows += derive(rows)
    judge(rows)
    absent = [n for n in TARGETS if not any(r["name"] == n for r in rows)]

    print(f"guest kernel: {KERNELS.get(a.kind, a.kind)}")
    print("targets: " + ", ".join(f"({k}) {v}" for k, v in TARGET_KINDS.items()) + ":")
    for r in rows:
        if "target" in r:
            print(f"  {r['target']:<13} {'met   ' if r['met'] else 'MISSED'} {r['ratio']:7.3g}x  {r['name']}")
    for n in absent:
        print(f"  ({TARGETS[n][0]}) NO ROW: {n}")
    print()
    table = [("name", "figure", "baseline", "ratio", "target", "")]
    for r in rows:
        status = "" if "target" not in r else "met" if r["met"] else "MISSED"
        table.append((r["name"], fmt(r["value"], r["unit"]), fmt(r["baseline"], r["unit"]),
                      f"{r['ratio']:.3g}x", r.get("target", ""), status))
    w = [max(len(t[i]) for t in table) for i in range(6)]
    line = lambda t: (f"{t[0]:<{w[0]}}  {t[1]:>{w[1]}}  {t[2]:>{w[2]}}  {t[3]:>{w[3]}}  "
                      f"{t[4]:<{w[4]}}  {t[5]}").rstrip()
    print(line(table[0]))
    print("-" * (sum(w) + 10))
    for t in table[1:]:
        print(line(t))
    print("\nHow each figure was obtained:")
    hows = {}
    for r in rows:
        hows.setdefault(r["how"], []).append(r["name"])
    for how, names in hows.items():
        print(f"  {names[0] if len(names) == 1 else names[0] + ' .. ' + names[-1]}: {how}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"\n{when}  {machine(a.kind)}")
    if a.wall:
        print(f"make bench wall time: {a.wall} s")
    for g in missing:
        print(f"MISSING: no rows for {g}", file=sys.stderr)

    profs = profiles(a.output)
    missed = [r for r in rows if "target" in r and not r["met"]]
    shown = set()
    if missed:
        print("\nProfiles of the workloads of missed rows (perf record -g -e cpu-clock -F 1000 in the "
              "guest, perf report --sort dso,sym, entries >= 1.5 %, then the call chains of the "
              "entries >= 15 %; under TCG the sampling timer "
              "fires far less often than asked and interrupts are taken at translation-block ends, "
              "which MMIO accesses force, so MMIO helpers are over-represented):")
    for r in missed:
        p = r["profile"]
        if p in shown:
            print(f"\n  {r['name']}: see the profile '{p}' above")
            continue
        shown.add(p)
        if p not in profs:
            print(f"\n  {r['name']}: no profile '{p}' in the output (BENCH_PROFILE=0?)")
            continue
        print(f"\n  {r['name']}: profile '{p}' ({profs[p]['command']})")
        for pl in profs[p]["lines"]:
            print(f"    {pl}")

    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"date": when, "machine": machine(a.kind), "kernel": a.kind,
                   "wall_seconds": a.wall, "rows": rows, "missing": missing,
                   "targets_without_row": absent, "profiles": profs}, f, indent=1)
    print(f"written {a.json}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
