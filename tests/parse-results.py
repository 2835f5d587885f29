#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Summarise a `make check` run.

usage: parse-results.py [--expect-kunit N] [--cargo LOG] MODEL=DIR...
       parse-results.py --boot-splat DIR   (exit 0 if the kernel splatted before the module loaded)

Each DIR holds the console.log (kernel console) and output.log (guest test plan output, see
tests/guest/run-tests) of one VM run. The script counts KUnit cases (KTAP) and kselftest cases
(TAP), fails a model on any kernel splat in its console log, when the device did not bind, when
the driver did not unload, or when kmemleak found a leak, and ends with one line
`N passed, N failed` over everything, cargo tests included. Exit status 1 on any failure.
"""

import argparse
import pathlib
import re
import sys

# Kernel reports that fail a run. Boot banners ("KernelAddressSanitizer initialized", "Lock
# dependency validator", "DMA-API: preallocated") deliberately do not match.
SPLATS = [
    r"BUG:",
    r"WARNING:",
    r"\bOops\b",
    r"Kernel panic",
    r"general protection fault",
    r"Call Trace:",
    r"possible circular locking dependency",
    r"possible recursive locking",
    r"inconsistent lock state",
    r"suspicious RCU usage",
    r"sleeping function called from invalid context",
    r"suspected memory leak",
    r"unreferenced object 0x",
    r"UBSAN:",
    r"DMA-API: .*\[device address=",
    r"rust_panic|panicked at",
    r"KASAN:",
]
SPLAT_RE = re.compile("|".join(f"(?:{p})" for p in SPLATS))
RESULT_RE = re.compile(r"^\s*(not ok|ok) (\d+) ?-? ?([^#]*?)\s*(#\s*(\w+).*)?$")


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def add(self, ok, skip, what):
        if skip:
            self.skipped += 1
        elif ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(what)


def blocks(text):
    """Yields (kind, name, lines) for each NU-BEGIN/NU-END block."""
    cur = None
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        m = re.match(r"^NU-BEGIN (\S+) (\S+)", line)
        if m:
            cur = (m.group(1), m.group(2), [])
            continue
        if cur and line.startswith(f"NU-END {cur[0]} {cur[1]}"):
            yield cur
            cur = None
            continue
        if cur:
            cur[2].append(line)
    if cur:
        yield (cur[0], cur[1], cur[2] + ["NU-TRUNCATED"])


def count_kunit(name, lines, tally, label):
    """Counts the leaf cases of one suite's KTAP results (the line naming the suite is its summary)."""
    cases = 0
    for line in lines:
        if line == "NU-TRUNCATED":
            tally.add(False, False, f"{label}: kunit {name}: output truncated")
            return 0
        m = RESULT_RE.match(line)
        if not m or m.group(3) == name:
            continue
        directive = (m.group(5) or "").upper()
        tally.add(m.group(1) == "ok", directive == "SKIP", f"{label}: kunit {name}.{m.group(3)}")
        cases += 1
    if cases == 0:
        tally.add(False, False, f"{label}: kunit {name}: no test case ran")
    return cases


def count_kselftest(name, lines, tally, label):
    cases = 0
    rc = None
    for line in lines:
        if line.startswith("NU-RC "):
            rc = int(line.split()[1])
            continue
        if line.startswith((" ", "\t", "#")):
            continue
        m = RESULT_RE.match(line)
        if not m:
            continue
        directive = (m.group(5) or "").upper()
        tally.add(m.group(1) == "ok", directive == "SKIP", f"{label}: kselftest {name}: {m.group(3)}")
        cases += 1
    if cases == 0 or rc is None or rc not in (0, 4):
        # 4 = KSFT_SKIP for a whole program.
        if rc not in (0, 4) or cases == 0:
            tally.add(False, False, f"{label}: kselftest {name}: exit status {rc}, {cases} cases")
    return cases


def check_model(label, d, tally, expect_kunit):
    console = (d / "console.log").read_text(errors="replace") if (d / "console.log").exists() else ""
    output = (d / "output.log").read_text(errors="replace") if (d / "output.log").exists() else ""
    suites = 0
    kunit_cases = 0
    kself_cases = 0
    for kind, name, lines in blocks(output):
        if kind == "kunit":
            suites += 1
            kunit_cases += count_kunit(name, lines, tally, label)
        elif kind == "kselftest":
            kself_cases += count_kselftest(name, lines, tally, label)
    print(f"{label}: {suites} KUnit suites ({kunit_cases} cases), {kself_cases} kselftest cases")

    def infra(ok, what):
        tally.add(ok, False, f"{label}: {what}")
        if not ok:
            print(f"{label}: FAILED: {what}")

    infra("NU-BOUND" in console, "device bound")
    infra(suites >= expect_kunit, f"at least {expect_kunit} KUnit suites ran")
    infra(kself_cases > 0, "kselftests ran")
    infra("NU-RMMOD ok" in output, "driver unloaded")
    infra("NU-DONE" in output, "test plan completed")
    splats = [ln.strip() for ln in (console + "\n" + output).splitlines() if SPLAT_RE.search(ln)]
    infra(not splats, "no kernel splat (BUG/WARNING/KASAN/lockdep/kmemleak/Oops/panic)")
    for s in splats[:20]:
        print(f"{label}:   splat: {s}")


def cargo_counts(path, tally):
    text = pathlib.Path(path).read_text(errors="replace")
    runs = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", text)
    passed = sum(int(r[1]) for r in runs)
    failed = sum(int(r[2]) for r in runs)
    tally.passed += passed
    tally.failed += failed
    if failed:
        tally.failures.append(f"cargo test: {failed} failed")
    if not runs:
        tally.add(False, False, "cargo test: no result line")
    print(f"cargo test: {passed} passed, {failed} failed")


def boot_splat(d):
    """Whether the console log of run directory `d` shows a splat before the module loaded."""
    console = (d / "console.log").read_text(errors="replace") if (d / "console.log").exists() else ""
    for line in console.splitlines():
        if "neuron_udma" in line:
            return False
        if SPLAT_RE.search(line):
            return True
    return False


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--boot-splat":
        return 0 if boot_splat(pathlib.Path(sys.argv[2])) else 1
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-kunit", type=int, default=1)
    ap.add_argument("--cargo")
    ap.add_argument("runs", nargs="+", metavar="MODEL=DIR")
    args = ap.parse_args()
    tally = Tally()
    if args.cargo:
        cargo_counts(args.cargo, tally)
    for run in args.runs:
        label, _, d = run.partition("=")
        check_model(label, pathlib.Path(d), tally, args.expect_kunit)
    for f in tally.failures:
        print(f"FAILED: {f}")
    line = f"{tally.passed} passed, {tally.failed} failed"
    if tally.skipped:
        line += f", {tally.skipped} skipped"
    print(line)
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
