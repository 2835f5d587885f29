#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Collect the results of one `make bench` run into one table and one JSON file.

usage: report.py --console LOG --output LOG --cargo LOG --check-log FILE --kernel-dir DIR
                 --kind bench|test --run-kernel-dir DIR --json OUT --wall SECONDS
                 [--host-cpu MODEL --host-load-start LOADAVG --host-load-end LOADAVG]
                 [--chart OUT.png ...]
       report.py --chart-from RESULTS.json --chart OUT.png [--chart OUT.svg ...]

Rows come from `NU-BENCH {json}` lines (the KUnit bench suite in the guest's console log, and
udma_bench in the guest command's output; the first row of each name counts), from the two
`udmactl bench` tables in the output (user queue, then --memcpy), from `cargo bench` of udma-sim
(model copy loop vs memcpy) and from the `make check` wall times that scripts/check appends to
check-times.log. Every row has name, value, unit, baseline, ratio (value / baseline) and how.
Some rows are derived from others of the same run (TARGETS' rows whose baseline is another row).
Rows named in TARGETS get a target, labelled by what it measures (TARGET_KINDS), and "met" or
"MISSED" (a row with the spread of interleaved repetitions, min and max, is "met" only if the whole
range meets the target and "UNSTABLE" if it straddles it; "TCG", with the reason, for a row TCG cannot
judge on this host: judge()); for each row MISSED or UNSTABLE the profile of its workload (`NU-PROFILE-BEGIN name` .. `NU-PROFILE-END name` in the
output, perf report of perf record -e cpu-clock) is printed after the table. Exit status 1 if an
expected group of rows is missing (a missed target is reported, not an error).

The scale rows (COPY_PREPARE per pair against the batch size, round-trip throughput against the
copy size, latency against the open buffers and queues) are also drawn as one chart of three
panels with matplotlib (--chart, PNG or SVG by the file's extension; --chart-from draws it from
the JSON of an earlier run). Without matplotlib the report says so and writes no chart (exit
status unchanged): Debian's python3-matplotlib, which the toolchain root has.
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
                   + r"\s+([\d.]+)x\s+([\d.]+)ms\s+(\d+)(?:\s+([\d.]+)-([\d.]+)x\s+(\d+))?")
UNIT = {"GB": 1e9, "MB": 1e6, "kB": 1e3}


# What each target measures: its label in the table, (a) .. (e), (zc), (holes), (ev) and (fill),
# as in Documentation/benchmarks.rst, "Targets".
TARGET_KINDS = {
    "a": "pair build",
    "b": "COPY_PREPARE per pair",
    "c": "small-copy latency",
    "d": "streaming",
    "e": "two threads",
    "zc": "zero-copy",
    "holes": "fragmented device memory",
    "ev": "completion events",
    "fill": "fills",
    "st": "striped copies",
    "m": "kernel memory per buffer",
}
# Targeted rows: name -> (kind of TARGET_KINDS, comparison, ratio bound, profile of its workload).
TARGETS = {
    # Equal structure: a call per pair on both sides, and both builders inlined in the loop;
    # per-round ratios of interleaved rounds (median, min-max).
    "prepare_one vs C reference, a call per pair (in kernel)": ("a", "<=", 1.0, "kernel"),
    "prepare_one vs C reference, inlined (in kernel)": ("a", "<=", 1.0, "kernel"),
    "COPY_PREPARE x256 time per pair": ("b", "<=", 3.0, "submit"),
    "COPY_PREPARE x2032 time per pair": ("b", "<=", 3.0, "submit"),
    "COPY_PREPARE x256 per pair, 1000 buffers open": ("b", "<=", 1.1, "lookup"),
    "COPY_PREPARE x256 per pair, 1000 buffers, a different buffer per entry": ("b", "<=", 1.5, "lookup"),
    # Baseline: the user copy of one entry + the in-kernel prepare_one, both of this run.
    "batch scale: COPY_PREPARE x2032 per pair": ("b", "<=", 1.2, "batch"),
    # The floor is PREPARE_ONE + START, measured interleaved with the copies (udma_bench). The
    # runtime's small copy is COPY_SUBMIT + FENCE_WAIT (one doorbell pair, as the floor); START +
    # COPY_WAIT (a second doorbell pair for the wait's marker) stays a labelled row without one.
    "latency 4 B copy (SUBMIT + FENCE_WAIT) p50 vs same-phase floor": ("c", "<=", 1.1, "latency"),
    "latency 4 B copy (SUBMIT + FENCE_WAIT) p99 vs p50": ("c", "<=", 3.0, "latency"),
    # Interleaved in one process (udmactl bench --against-memcpy), median and range.
    "streaming 64M host->HBM: user queue vs MEMCPY": ("d", ">=", 1.0, "stream"),
    "streaming 64M HBM->host: user queue vs MEMCPY": ("d", ">=", 1.0, "stream"),
    "submit PREPARE x16, 2 threads": ("e", ">=", 1.8, "threads"),
    "submit PREPARE x256, 2 threads": ("e", ">=", 1.8, "threads"),
    "submit PREPARE x2032, 2 threads": ("e", ">=", 1.8, "threads"),
    # Zero-copy (MEM_IMPORT) against the copy into a coherent buffer + DMA.
    "zero-copy 64M host->HBM (user queue)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M HBM->host (user queue)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M host->HBM (MEMCPY)": ("zc", ">=", 1.5, "zerocopy"),
    "zero-copy 64M HBM->host (MEMCPY)": ("zc", ">=", 1.5, "zerocopy"),
    # MEM_ALLOC of device memory with 8,192 one-slot holes against 1 hole (udma_bench).
    "MEM_ALLOC failing, 8192 holes vs 1 hole": ("holes", "<=", 2.0, "holes"),
    "MEM_ALLOC succeeding, 8192 holes vs 1 hole": ("holes", "<=", 2.0, "holes"),
    # One thread + epoll against a thread per queue (udmactl multiqueue --json, mq_rows): on both
    # vCPUs (TCG cannot judge, tcg_cannot_judge) and with everything on one.
    "16 queues: one thread + epoll vs 16 threads in COPY_WAIT": ("ev", ">=", 0.9, "multiqueue"),
    "16 queues: one thread + epoll vs 16 threads in FENCE_WAIT": ("ev", ">=", 0.9, "multiqueue"),
    "16 queues, one CPU: one thread + epoll vs 16 threads in COPY_WAIT":
        ("ev", ">=", 0.9, "multiqueue"),
    "16 queues, one CPU: one thread + epoll vs 16 threads in FENCE_WAIT":
        ("ev", ">=", 0.9, "multiqueue"),
    # io_uring submission per pair against the ioctls that do nearly the same work, COPY_PREPARE
    # + COPY_SUBMIT of the same batches on queues with an eventfd: both sides submit and arrange a
    # completion notice (udma_bench; the SQE also queues its command while its fence is in
    # flight). The rows without the eventfd have no target: there the SQE also arranges its CQE,
    # which the ioctls leave to their untimed FENCE_WAIT.
    "URING_COPY 1 SQE x2032 on queues with an eventfd submission per pair vs COPY_PREPARE + "
    "COPY_SUBMIT": ("ev", "<=", 1.0, "uring"),
    "URING_COPY 8 SQEs x254 on queues with an eventfd submission per pair vs COPY_PREPARE + "
    "COPY_SUBMIT": ("ev", "<=", 1.0, "uring"),
    # From COPY_SUBMIT (io_uring: the SQE's issue) to the waiter's wake-up, each kind interleaved
    # with COPY_WAIT (udma_bench).
    "COPY_SUBMIT to wake-up p50: epoll vs COPY_WAIT": ("ev", "<=", 1.2, "wakeup"),
    "COPY_SUBMIT to wake-up p50: eventfd vs COPY_WAIT": ("ev", "<=", 1.2, "wakeup"),
    "URING_COPY issue to wake-up p50: io_uring vs COPY_WAIT": ("ev", "<=", 1.2, "wakeup"),
    "URING_COPY issue to wake-up p50: io_uring IOPOLL vs COPY_WAIT": ("ev", "<=", 1.2, "wakeup"),
    # MEMSET against MEMCPY of the same bytes (udma_bench).
    "MEMSET 4M host vs MEMCPY host->host": ("fill", ">=", 0.9, "fill"),
    "MEMSET 4M HBM vs MEMCPY HBM->HBM": ("fill", ">=", 0.9, "fill"),
    "MEMSET 64M HBM vs MEMCPY HBM->HBM": ("fill", ">=", 0.9, "fill"),
    # Striped MEMCPYs against as many calls just below the stripe threshold (udma_bench).
    "MEMCPY 16 x 4M HBM->HBM: striped vs one engine": ("st", ">=", 1.4, "fill"),
    # Slab charged to a memory cgroup per buffer against the bound of 512 B (udma_bench; a
    # memory figure: no CPU profile).
    "kernel memory per 4 KiB device buffer": ("m", "<=", 1.0, None),
    "kernel memory per one-page import": ("m", "<=", 1.0, None),
}
# Targeted rows that TCG (QEMU's software CPU, which every guest here runs on) cannot judge: the
# reason, from the row's name and the host's CPU count, or None. Such a row is printed with its
# figure and target and "TCG" instead of a verdict.
USER_COPY_ROWS = ("COPY_PREPARE x256 time per pair", "COPY_PREPARE x2032 time per pair")


def tcg_cannot_judge(name, host_cpus):
    if name in USER_COPY_ROWS:
        return ("the entries' user copy is TCG's byte-wise rep movsb (the row 'COPY_PREPARE user "
                "copy per entry'), and the baseline, prepare_one in the kernel, has none")
    if TARGETS[name][0] == "e" and host_cpus < 4:
        return (f"{host_cpus} host CPUs for the 2 vCPU threads, QEMU's main loop and the device "
                f"model: 2 threads cannot scale")
    if name.startswith("16 queues: "):
        return ("the guest's CPU time per fence bounds both ways under TCG, not the model's "
                "engines: the 16 threads use both vCPUs, the one thread one (its cpu seconds equal "
                "its run's); judged on one CPU (the '16 queues, one CPU' rows)")
    if TARGETS[name][0] == "st" and host_cpus < 4:
        return (f"{host_cpus} host CPUs for the model's engine threads (one per H2T engine), the "
                f"2 vCPU threads and QEMU's main loop: the parts cannot run in parallel")
    return None


# Rows whose baseline is in another unit than the row (prepare_one's ns/pair).
BASELINE_UNIT = {
    "BAR0 doorbell-sized write (in kernel)": "ns/pair",
    "COPY_PREPARE entry array alloc+free (in kernel)": "ns/pair",
    "KVec alloc+free of one entry (in kernel)": "ns/pair",
    "COPY_PREPARE user copy per entry (x2032)": "ns/pair",
}

# Row names of the chart's panels (udma_bench writes them; the round trips are derive()'s).
BATCH_RE = re.compile(r"^batch scale: COPY_PREPARE x(\d+) per pair$")
ROUNDTRIP_RE = re.compile(r"^round trip (\S+) host->HBM->host \((user queue|MEMCPY)\)$")
ONEWAY_RE = re.compile(r"^(user queue|MEMCPY) (\S+) (host->HBM|HBM->host)$")
LATSCALE_RE = re.compile(r"^latency scale: (p50|p99), (\d+) (buffer|queue)s? open$")
USER_COPY = "COPY_PREPARE user copy per entry (x2032)"
SIZE_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(s):
    """udmactl's size column (4K, 64K, 1M, 64M, or bytes) as a number."""
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    return int(m.group(1)) * SIZE_UNIT[m.group(2)] if m else 0


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
    """Rows whose baseline comes from another row of the same run (targets (b) and (d)), and the
    round-trip rows of the throughput panel."""
    by = {r["name"]: r for r in rows}
    new = []
    prep = by.get("prepare_one (in kernel)")
    ucopy = by.get(USER_COPY)
    for r in rows:
        if r["name"].startswith("COPY_PREPARE x") and r["name"].endswith("time per pair") and prep:
            r["baseline"] = prep["value"]
            r["ratio"] = r["value"] / prep["value"] if prep["value"] else 0
    if ucopy and prep:
        ucopy["baseline"] = prep["value"]
        ucopy["ratio"] = ucopy["value"] / prep["value"] if prep["value"] else 0
    for r in rows:
        if BATCH_RE.match(r["name"]) and "min" not in r:
            # Without either half of the baseline the row stays at baseline 0 (a target: MISSED).
            # The targeted x2032 row brings its own, measured in its phase (with a range).
            if ucopy and prep:
                r["baseline"] = ucopy["value"] + prep["value"]
                r["ratio"] = r["value"] / r["baseline"] if r["baseline"] else 0
                r["how"] += (f" ({ucopy['value']:.1f} ns/entry + {prep['value']:.1f} ns/pair)")
    for d in ("host->HBM", "HBM->host"):
        uq, mc = by.get(f"user queue 64M {d}"), by.get(f"MEMCPY 64M {d}")
        # udmactl bench --against-memcpy prints the row itself, interleaved, with its range.
        if uq and mc and f"streaming 64M {d}: user queue vs MEMCPY" not in by:
            new.append({"name": f"streaming 64M {d}: user queue vs MEMCPY", "value": uq["value"],
                        "unit": "B/s", "baseline": mc["value"],
                        "ratio": uq["value"] / mc["value"] if mc["value"] else 0,
                        "how": "udmactl bench --pipeline --sizes 64M through two user queues "
                               "(neuron_udma::Pipeline: the next batch is prepared and started "
                               "while the engine runs the previous one); baseline: udmactl bench "
                               "--memcpy (the MEMCPY ioctl) of the same run"})
    # host -> HBM -> host: the bytes over the time of both directions, 1 / (1/up + 1/down).
    sizes = sorted({m.group(2) for m in map(ONEWAY_RE.match, by) if m}, key=size_bytes)
    trip = {}
    for via in ("MEMCPY", "user queue"):
        for size in sizes:
            up, down = by.get(f"{via} {size} host->HBM"), by.get(f"{via} {size} HBM->host")
            if up and down and up["value"] and down["value"]:
                trip[via, size] = (1 / (1 / up["value"] + 1 / down["value"]), up["baseline"])
    for via in ("user queue", "MEMCPY"):
        for size in sizes:
            if (via, size) not in trip:
                continue
            value, memcpy = trip[via, size]
            if via == "MEMCPY":
                base = memcpy / 2
                base_how = "two guest memcpys of the same bytes (there and back)"
            else:
                base = trip.get(("MEMCPY", size), (0, 0))[0]
                base_how = "the MEMCPY round trip of the same size"
            new.append({"name": f"round trip {size} host->HBM->host ({via})", "value": value,
                        "unit": "B/s", "baseline": base, "ratio": value / base if base else 0,
                        "how": f"{size} host->HBM then HBM->host, {via} (the udmactl bench rows "
                               f"'{via} {size} host->HBM' and '... HBM->host' of this run): the "
                               f"bytes over the sum of the two best times; baseline: {base_how}"})
    return new


def meets(ratio, op, bound):
    return ratio <= bound if op == "<=" else ratio >= bound


def judge(rows, host_cpus):
    """A targeted row's verdict: met or MISSED by its ratio; a row that carries the spread of
    interleaved repetitions (min, max) is met only if the whole range meets the target, MISSED
    if none of it does, UNSTABLE if the range straddles the bound (median_met: whether its median
    meets it); TCG, with the reason, for a row TCG cannot judge on this host (tcg_cannot_judge)."""
    for r in rows:
        t = TARGETS.get(r["name"])
        if not t:
            continue
        kind, op, bound, prof = t
        # One decimal, as Documentation/benchmarks.rst writes the bounds ("<= 1.0x").
        target = f"({kind}) {op} {bound:.1f}x"
        why = tcg_cannot_judge(r["name"], host_cpus)
        if why:
            r.update({"target": target, "met": None, "verdict": "TCG",
                      "tcg": why, "profile": prof})
            continue
        if not r["baseline"]:
            verdict = "MISSED"
        elif "min" in r and "max" in r:
            lo, hi = meets(r["min"], op, bound), meets(r["max"], op, bound)
            verdict = "met" if lo and hi else "MISSED" if not (lo or hi) else "UNSTABLE"
        else:
            verdict = "met" if meets(r["ratio"], op, bound) else "MISSED"
        r.update({"target": target, "met": verdict == "met",
                  "verdict": verdict, "profile": prof})
        if verdict == "UNSTABLE":
            # Which side of the bound the median (the row's ratio) is on.
            r["median_met"] = meets(r["ratio"], op, bound)


def host_cpus(host_cpu):
    """The host's CPU count from scripts/bench's "N x MODEL", else this machine's."""
    m = re.match(r"(\d+) x ", host_cpu or "")
    return int(m.group(1)) if m else (os.cpu_count() or 1)


def ratio_text(r):
    """The ratio, with the range of the repetitions when the row has one (to the thousandth, so
    that a range printed as meeting a bound does)."""
    if "min" in r and "max" in r:
        return f"{r['ratio']:.3f}x ({r['min']:.3f}-{r['max']:.3f}x, {r.get('reps', '?')} reps)"
    return f"{r['ratio']:.3g}x"


def udmactl_rows(path):
    """The `udmactl bench` tables: the first without --memcpy (user queue), then MEMCPY."""
    rows, via = [], None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.replace("\r", "")
            if "size" in line and "via" in line:
                # The zero-copy tables (zc_rows) have rows of their own format; the
                # --against-memcpy table's rows are its NU-BENCH lines (bench_lines).
                if "zero-copy" in line or "against MEMCPY" in line:
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
                   f"SIZES: best of 3; sizes above 4 MiB move in 4 MiB rounds (host buffers are "
                   f"at most 4 MiB), via {ring}; baseline: guest memcpy of the same bytes (best of 3)")
            rows.append({"name": f"{via} {size} {path_}", "value": value, "unit": "B/s",
                         "baseline": base, "ratio": value / base if base else 0, "how": how})
    for via in ("user queue", "MEMCPY"):
        mine = [r for r in rows if r["name"].startswith(via + " ")]
        sizes = []
        for r in mine:
            size = r["name"].split()[-2]
            if size not in sizes:
                sizes.append(size)
        for r in mine:
            r["how"] = r["how"].replace("SIZES", ",".join(sizes))
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
            size, path_, v, vu, b, bu, ratio, pin, runs, lo, hi, reps = m.groups()
            value, base = float(v) * UNIT[vu], float(b) * UNIT[bu]
            opt = "--memcpy" if via == "MEMCPY" else "--pipeline"
            how = (f"udmactl bench --zero-copy {opt}: the process's own {size} buffer imported "
                   f"(MEM_IMPORT; {'read-only' if path_ == 'host->HBM' else 'IMPORT_WRITE'}), copied "
                   f"via {ring}, freed, import and free timed with it (pin_ms: their part in the best run; "
                   f"runs: the import's physically contiguous runs, each boundary a copy crosses "
                   f"costs one more descriptor pair); "
                   f"baseline: the same bytes through a 4 MiB coherent host buffer, a CPU memcpy "
                   f"between it and the process buffer per 4 MiB round plus the DMA; "
                   + (f"{reps} repetitions of each, alternating (which goes first alternates): "
                      f"the rates' medians, the ratio the median of the per-repetition ratios, "
                      f"min and max beside it" if reps else "best of 3 each"))
            row = {"name": f"zero-copy {size} {path_} ({via})", "value": value, "unit": "B/s",
                   "baseline": base, "ratio": value / base if base else 0, "how": how,
                   "pin_ms": float(pin), "runs": int(runs)}
            if reps:
                row.update({"ratio": float(ratio), "min": float(lo), "max": float(hi),
                            "reps": int(reps)})
            rows.append(row)
    return rows


def mask_cpus(mask):
    """The CPUs of a sysfs hex cpumask ("1", "3", "ff,ffffffff") as "0, 1", or the mask itself
    if it does not parse."""
    try:
        bits = int(mask.replace(",", ""), 16)
    except ValueError:
        return mask
    return ", ".join(str(i) for i in range(bits.bit_length()) if bits >> i & 1)


def mq_rows(path):
    """The `udmactl multiqueue --json` objects of the output: one thread + epoll against one thread
    per queue (FENCE_WAIT, or COPY_WAIT with --thread-wait copy-wait). Returns the rows and the
    verdicts of the runs that failed."""
    rows, failed = [], []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.replace("\r", "").strip()
            if not (line.startswith('{"device"') and '"verdict"' in line):
                continue
            try:
                mq = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"report: bad udmactl multiqueue line in {path}: {e}", file=sys.stderr)
                continue
            modes = {m.get("mode"): m for m in mq.get("modes", [])}
            ep, th = modes.get("epoll"), modes.get("threads")
            if not mq.get("ok") or not ep or not th:
                failed.append(mq.get("verdict", "no verdict"))
                continue
            n = len(mq.get("queues", []))
            engines = sorted({q["engine"] for q in mq.get("queues", [])})
            # A run under taskset on one CPU (make bench's one-CPU rows): named so, and where.
            cpus = mq.get("cpus", [])
            one, where = "", ""
            if len(cpus) == 1:
                wq = mq.get("workqueue_cpumask", "?")
                one = ", one CPU"
                where = (f"; every thread on CPU {cpus[0]} (taskset), the unbound workqueues on "
                         f"CPU {mask_cpus(wq)} (cpumask {wq}, hex)")
            how = (f"udmactl multiqueue --json: {n} queues (queue 1 of engines "
                   f"{engines[0]}-{engines[-1]}), each copying {mq['window'] >> 10} KiB {mq['passes']} "
                   f"times over in fences of {mq['batch']} copies of {mq['copy_size'] >> 10} KiB, "
                   f"depth {mq['depth']}, {mq['ring_size']}-slot rings; best of {mq['iters']} runs of "
                   f"each mode, alternating, byte-exact: one thread submitting to every queue and "
                   f"sleeping in epoll_wait + QUEUE_EVENTS ({ep['seconds']:.3f} s, "
                   f"{ep['epoll_wakeups']} wakeups, cpu {ep['cpu_seconds']:.3f} s); baseline: "
                   f"{th['threads']} threads, one per queue, blocked in {th['wait']} "
                   f"({th['seconds']:.3f} s, cpu {th['cpu_seconds']:.3f} s){where}; {mq['label']}")
            row = {"name": f"{n} queues{one}: one thread + epoll vs {th['threads']} threads in "
                           f"{th['wait']}",
                   "value": ep["bytes_per_second"], "unit": "B/s",
                   "baseline": th["bytes_per_second"],
                   "ratio": ep["bytes_per_second"] / th["bytes_per_second"]
                   if th["bytes_per_second"] else 0, "how": how}
            rr = mq.get("ratios")
            if rr:
                # Each iteration ran both modes (which first alternating): its ratio gives the range.
                row.update({"ratio": rr["median"], "min": rr["min"], "max": rr["max"],
                            "reps": rr["reps"]})
                row["how"] += ("; ratio: the median of the iterations' ratios (each iteration "
                               "runs both modes), min and max beside it")
            rows.append(row)
    return rows, failed


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


def chart_series(rows):
    """The chart's data from the rows: per panel, series of (x, y) points sorted by x."""
    batch, thr, lat = {}, {}, {}
    for r in rows:
        name = r["name"]
        m = BATCH_RE.match(name)
        if m:
            batch.setdefault("COPY_PREPARE, time per pair", []).append((int(m.group(1)), r["value"]))
            continue
        m = ROUNDTRIP_RE.match(name)
        if m:
            thr.setdefault(f"{m.group(2)}, host->HBM->host", []).append(
                (size_bytes(m.group(1)), r["value"] / 1e6))
            continue
        m = ONEWAY_RE.match(name)
        if m:
            thr.setdefault(f"{m.group(1)}, {m.group(3)}", []).append(
                (size_bytes(m.group(2)), r["value"] / 1e6))
            continue
        m = LATSCALE_RE.match(name)
        if m:
            what = m.group(3) + "s"
            lat.setdefault(f"{m.group(1)}, open {what}", []).append((int(m.group(2)), r["value"]))
            if m.group(1) == "p50" and r.get("floor_us"):
                lat.setdefault(f"floor p50, open {what}", []).append((int(m.group(2)), r["floor_us"]))
    return [{k: sorted(v) for k, v in d.items()} for d in (batch, thr, lat)]


def draw_chart(rows, title, paths):
    """Draws the three scale panels into each of `paths` (PNG or SVG by extension). Returns False,
    after saying why, when matplotlib is not installed; raises on any other failure."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"chart: not drawn: {sys.executable} has no matplotlib ({e}); install Debian's "
              f"python3-matplotlib (scripts/root-packages lists it: a toolchain root built since "
              f"has it), then draw it from the JSON: report.py --chart-from RESULTS.json "
              f"--chart OUT.png")
        return False
    batch, thr, lat = chart_series(rows)
    by = {r["name"]: r for r in rows}
    fig, ax = plt.subplots(1, 3, figsize=(17, 5.2))
    fig.suptitle(title, fontsize=10)

    def empty(a, what):
        a.text(0.5, 0.5, f"no {what} rows in this run", ha="center", va="center",
               transform=a.transAxes, color="gray")

    a = ax[0]
    for label, pts in batch.items():
        a.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        for x, y in pts:
            a.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6),
                       ha="center", fontsize=7)
    ucopy, prep = by.get(USER_COPY), by.get("prepare_one (in kernel)")
    if ucopy and prep:
        base = ucopy["value"] + prep["value"]
        a.axhline(base, color="gray", ls="--", lw=1,
                  label=f"user copy of one entry + prepare_one (in kernel): {base:.0f} ns")
        bound = TARGETS["batch scale: COPY_PREPARE x2032 per pair"][2]
        a.axhline(base * bound, color="red", ls=":", lw=1, label=f"target for x2032: {bound:g}x that")
    if batch:
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        xs = sorted({p[0] for pts in batch.values() for p in pts})
        a.set_xticks(xs)
        a.set_xticklabels([str(x) for x in xs], rotation=35, fontsize=8)
        a.legend(fontsize=7)
    else:
        empty(a, "batch scale")
    a.set_xlabel("entries per COPY_PREPARE call")
    a.set_ylabel("ns per pair (time inside the calls)")
    a.set_title("COPY_PREPARE cost per pair vs batch size", fontsize=10)

    a = ax[1]
    colors = {"user queue": "tab:blue", "MEMCPY": "tab:orange"}
    for label, pts in thr.items():
        via, path = label.split(", ")
        trip = path == "host->HBM->host"
        a.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if trip else ".--",
               color=colors.get(via), lw=2 if trip else 0.8, alpha=1 if trip else 0.6,
               label=label)
    if thr:
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        xs = sorted({p[0] for pts in thr.values() for p in pts})
        a.set_xticks(xs)
        a.set_xticklabels([f"{x >> 20}M" if x >= 1 << 20 else f"{x >> 10}K" for x in xs])
        a.legend(fontsize=7)
    else:
        empty(a, "throughput")
    a.set_xlabel("bytes per transfer (above 4 MiB in 4 MiB rounds)")
    a.set_ylabel("MB/s (best of 3)")
    a.set_title("throughput vs copy size (round trip solid, one way dashed)", fontsize=10)

    a = ax[2]
    colors = {"buffers": "tab:green", "queues": "tab:purple"}
    for label, pts in lat.items():
        what = label.rsplit(" ", 1)[1]
        style = {"p50": "o-", "p99": "s--"}.get(label.split(",")[0], ":")
        a.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colors.get(what),
               lw=1 if style == ":" else 1.5, label=label)
    if lat:
        a.set_xscale("log")
        xs = sorted({p[0] for pts in lat.values() for p in pts})
        a.set_xticks(xs)
        a.set_xticklabels([str(x) for x in xs])
        a.legend(fontsize=7)
        a.set_ylim(bottom=0)
    else:
        empty(a, "latency scale")
    a.set_xlabel("host buffers open in the file / queues initialised")
    a.set_ylabel("us, PREPARE_ONE + START + WAIT of 4 B")
    a.set_title("small-copy latency vs open buffers and queues", fontsize=10)

    fig.tight_layout(rect=(0, 0, 1, 0.95))
    for path in paths:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        print(f"chart: written {path}")
    plt.close(fig)
    return True


def chart_title(date, kind, host_load):
    load = f"; host load average {host_load}" if host_load else ""
    return f"make bench, {date}, {kind} kernel, trn1 model under QEMU TCG{load}"


def chart_from(argv):
    ap = argparse.ArgumentParser(description="draw the scale chart from the JSON of a run")
    ap.add_argument("--chart-from", required=True, metavar="RESULTS.json")
    ap.add_argument("--chart", action="append", required=True, metavar="OUT.png")
    a = ap.parse_args(argv)
    with open(a.chart_from) as f:
        res = json.load(f)
    host = res.get("host", {})
    load = " -> ".join(x for x in (host.get("load_start"), host.get("load_end")) if x)
    draw_chart(res.get("rows", []), chart_title(res.get("date", "?"), res.get("kernel", "?"), load),
               a.chart)
    return 0


def main():
    if "--chart-from" in sys.argv[1:]:
        return chart_from(sys.argv[1:])
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
    ap.add_argument("--host-cpu", default="", help="the host's CPU model (scripts/bench)")
    ap.add_argument("--host-load-start", default="", help="the host's /proc/loadavg at the start")
    ap.add_argument("--host-load-end", default="", help="the host's /proc/loadavg at the end")
    ap.add_argument("--chart", action="append", default=[], metavar="OUT.png",
                    help="draw the scale chart there (PNG or SVG; repeatable)")
    a = ap.parse_args()

    mq, mq_failed = mq_rows(a.output)
    groups = [
        ("1. descriptor pair build (KUnit)", bench_lines(a.console)),
        ("2+4. submission rate and latency (udma_bench)", bench_lines(a.output)),
        ("3. copy throughput (udmactl bench)", udmactl_rows(a.output)),
        ("6. zero-copy (udmactl bench --zero-copy)", zc_rows(a.output)),
        ("7. one thread + epoll against a thread per queue (udmactl multiqueue)", mq),
        ("3. model copy loop (cargo bench)", cargo_rows(a.cargo)),
        ("5. build and test cost", kernel_rows(a.kind, a.run_kernel_dir, a.kernel_dir)
         + check_rows(a.check_log, a.kernel_dir)),
    ]
    missing = [g for g, rows in groups if not rows]
    rows = [r for _, rs in groups for r in rs]
    rows += derive(rows)
    judge(rows, host_cpus(a.host_cpu))
    absent = [n for n in TARGETS if not any(r["name"] == n for r in rows)]

    print(f"guest kernel: {KERNELS.get(a.kind, a.kind)}")
    print("targets: " + ", ".join(f"({k}) {v}" for k, v in TARGET_KINDS.items()) + ":")
    for r in rows:
        if "target" in r:
            print(f"  {r['target']:<15} {r['verdict']:<8} {ratio_text(r):>7}  {r['name']}"
                  + (f" (no verdict: {r['tcg']})" if "tcg" in r else "")
                  + (" (median misses the target)" if r.get("median_met") is False else ""))
    for n in absent:
        print(f"  ({TARGETS[n][0]}) NO ROW: {n}")
    for v in mq_failed:
        print(f"  (ev) udmactl multiqueue: {v}")
    # The load each kind of target was measured at (the rows that carry the guest's load average
    # around their phase), with the host's and its CPU.
    for kind, phase in (("c", "the latency phase"), ("holes", "the MEM_ALLOC phase"),
                        ("ev", "the first phase of its rows"), ("fill", "the first fill row"),
                        ("st", "the striped-copy row")):
        lat = next((r for r in rows if r["name"] in TARGETS and TARGETS[r["name"]][0] == kind
                    and "load_start" in r), None)
        if lat:
            print(f"  ({kind}) measured at guest load average {lat['load_start']} -> {lat['load_end']} "
                  f"(1, 5, 15 min; before and after {phase}), host load average "
                  f"{a.host_load_start or '?'} -> {a.host_load_end or '?'} (start and end of make "
                  f"bench; {a.host_cpu or 'host CPU not given'})")
    print()
    table = [("name", "figure", "baseline", "ratio", "target", "")]
    for r in rows:
        status = r.get("verdict", "")
        table.append((r["name"], fmt(r["value"], r["unit"]),
                      fmt(r["baseline"], BASELINE_UNIT.get(r["name"], r["unit"])),
                      ratio_text(r), r.get("target", ""), status))
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
    if a.host_load_start or a.host_load_end:
        print(f"host during make bench: {a.host_cpu or 'CPU not given'}; /proc/loadavg "
              f"{a.host_load_start or '?'} (start), {a.host_load_end or '?'} (end)")
    if a.wall:
        print(f"make bench wall time: {a.wall} s")
    for g in missing:
        print(f"MISSING: no rows for {g}", file=sys.stderr)

    profs = profiles(a.output)
    missed = [r for r in rows if r.get("verdict") in ("MISSED", "UNSTABLE")]
    shown = set()
    if missed and not profs:
        print(f"\nNo profiles in the output (BENCH_PROFILE=0?): {len(missed)} rows not met")
        missed = []
    if missed:
        print("\nProfiles of the workloads of missed rows (perf record -g -e cpu-clock -F 1000 in the "
              "guest, perf report --sort dso,sym, entries >= 1.5 %, then the call chains of the "
              "entries >= 15 %; under TCG the sampling timer "
              "fires far less often than asked and interrupts are taken at translation-block ends, "
              "which MMIO accesses force, so MMIO helpers are over-represented):")
    for r in missed:
        p = r["profile"]
        if p is None:
            print(f"\n  {r['name']}: a memory figure, no CPU profile")
            continue
        if p not in profs:
            print(f"\n  {r['name']}: no profile '{p}' in the output (BENCH_PROFILE=0?)")
            continue
        if p in shown:
            print(f"\n  {r['name']}: see the profile '{p}' above")
            continue
        shown.add(p)
        print(f"\n  {r['name']}: profile '{p}' ({profs[p]['command']})")
        for pl in profs[p]["lines"]:
            print(f"    {pl}")

    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"date": when, "machine": machine(a.kind), "kernel": a.kind,
                   "host": {"cpu": a.host_cpu, "load_start": a.host_load_start,
                            "load_end": a.host_load_end},
                   "wall_seconds": a.wall, "rows": rows, "missing": missing,
                   "targets_without_row": absent, "multiqueue_failed": mq_failed,
                   "profiles": profs}, f, indent=1)
    print(f"written {a.json}")
    chart_failed = False
    if a.chart:
        load = " -> ".join(x for x in (a.host_load_start, a.host_load_end) if x)
        try:
            draw_chart(rows, chart_title(when, a.kind, load), a.chart)
        except Exception as e:  # a broken chart must not hide the table above
            print(f"chart: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            chart_failed = True
    return 1 if missing or chart_failed else 0


if __name__ == "__main__":
    sys.exit(main())
