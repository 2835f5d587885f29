#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The gate of `make check`: check every result against tests/expected.toml and summarise.

usage: parse-results.py [--manifest TOML] [--lint LOG] [--unittest LOG] [--cargo LOG] [--dkms LOG]
                        MODEL[:PASS]=DIR...
       parse-results.py --boot-splat DIR     exit 0 if the kernel splatted before the module loaded
       parse-results.py --splats DIR         print the splat lines of DIR's console.log and
                                                 output.log; exit 1 if there is one
       parse-results.py --list kunit|kselftest|guest-commands|examples|passes [--pass PASS]
                                                 what the manifest requires, one a line (kselftest:
                                                 the programs; guest-commands and examples: NAME
                                                 COMMAND; passes: NAME DEVICES [numa] [switch] of each extra
                                                 pass); with --pass only that pass's (main: the
                                                 one-device pass)

Each DIR holds the console.log (kernel console) and output.log (the guest test plan's output, see
tests/guest/run-tests) of one VM run on MODEL (trn1, trn2): MODEL=DIR is its main pass (one device,
the KUnit suites and the kselftests without a `pass` in the manifest), MODEL:PASS=DIR a pass of
the manifest's [passes] (its `devices` devices, its kselftests). Every pass of the manifest must be
given for each model given. A model fails when:
  - a KUnit suite, kselftest or example named in the manifest did not run, or one not named there ran;
  - an example ([example.NAME]: a command of the guest image, examples/ and the client crate's
    examples/) exited non-zero, lost its end marker, or did not print its `expect` line;
  - a suite's or binary's plan line (1..N) disagrees with its reported cases, has fewer cases than
    the manifest's min_cases, its own verdict is `not ok`, or a block lost its end marker;
  - a KUnit suite's results in debugfs and on the console (where KUnit printed them at load) differ
    or are not `ok`;
  - a case failed, or skipped without an entry in the manifest's [[skip]] allow-list;
  - the kernel logged a splat (BUG, WARNING, KASAN, lockdep, kmemleak, hung task, soft lockup, RCU
    stall, DMA-API error or leak, a Rust assertion outside KUnit, Oops, panic);
  - kmemleak or DMA-API debugging disabled itself, kmemleak did not accept both scans after the
    unloads or reported a leak, or DMA-API debugging counted an error;
  - a dmatest phase (tests/kselftest/dmatest_test.c) is missing or unfinished, or its summary
    lines show a failure, a result line, fewer tests per channel than requested or fewer channels
    (or, for the injected fault, no failure);
  - the bound device is not the model's (trn1 = 1d0f:7164, trn2 = 1d0f:7364), the driver did not
    unload, load and unload again, or the test plan did not complete;
  - in an extra pass, the guest did not have the pass's number of devices, all of the model's and
    bound to neuron_udma (NU-DEVICE lines), or the pass did not run at all.
The DKMS stage (--dkms LOG, the output of scripts/dkms-check with scripts/check's NU-DKMS-EXIT and
NU-DKMS-SECONDS lines) fails when a step the manifest's [dkms] names did not print its
`NU-DKMS ok STEP` line, or the script exited non-zero; with a [dkms] table in the manifest, VM
runs given without --dkms fail too (the stage did not run).
The last line is `N passed, N failed` (`, N skipped`) over everything, shellcheck (one per script),
the parser's unit tests and cargo tests included. Exit status 1 on any failure.
"""

import argparse
import pathlib
import re
import sys
import tomllib

TOP = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = TOP / "tests" / "expected.toml"

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
    r"DMA-API: .*(leak|pending DMA allocations)",
    r"rust_panic|panicked at",
    r"KASAN:",
    r"ASSERTION FAILED",
    r"not reported to KUnit",
    r"INFO: task .* blocked for more than",
    r"soft lockup",
    r"rcu_sched self-detected stall|rcu: INFO:",
    r"ODEBUG:",
]
SPLAT_RE = re.compile("|".join(f"(?:{p})" for p in SPLATS))

# The memory-cgroup OOM report a kselftest provokes on purpose (kmem_bound_test: a task named
# EXPECTED_OOM_COMM exceeds its cgroup's memory.max). Its stack dump is not a splat; the report
# ends with the "Killed process" line. Any other OOM report still fails the run.
EXPECTED_OOM_COMM = "nu_memcg_oom"
OOM_START_RE = re.compile(r"\b(\S+) invoked oom-killer:")
OOM_END_RE = re.compile(r"out of memory: Killed process")


def splat_lines(lines):
    """The lines of `lines` that are kernel splats, leaving out the expected OOM report."""
    out, expected = [], False
    for ln in lines:
        m = OOM_START_RE.search(ln)
        if m:
            expected = m.group(1) == EXPECTED_OOM_COMM
        if expected:
            if OOM_END_RE.search(ln):
                expected = False
            continue
        if SPLAT_RE.search(ln):
            out.append(ln.strip())
    return out

# A sanitizer that switched itself off proves nothing afterwards.
SANITIZER_OFF = [
    r"kmemleak: Kernel memory leak detector disabled",
    r"kmemleak: Cannot allocate",
    r"kmemleak: Memory pool empty",
    r"[Kk]memleak disabled",
    r"DMA-API: .*(disabling|disabled)",
    r"dma-debug disabled",
]
SANITIZER_OFF_RE = re.compile("|".join(f"(?:{p})" for p in SANITIZER_OFF))
# What the boot log must show (the sanitizers were there to begin with).
BOOT_EVIDENCE = {
    "KASAN initialized": re.compile(r"KernelAddressSanitizer initialized"),
    "kmemleak initialized": re.compile(r"kmemleak: Kernel memory leak detector initialized"),
    "DMA-API debugging enabled": re.compile(r"DMA-API: debugging enabled by kernel config"),
}

TIMESTAMP_RE = re.compile(r"^\[\s*\d+\.\d+\] ?")
RESULT_RE = re.compile(r"^(not ok|ok) (\d+)(?: -)? ?(.*?)\s*(?:#\s*(SKIP|TODO)\b\s*(.*))?$", re.I)
PLAN_RE = re.compile(r"^1\.\.(\d+)\s*$")
# Under a failed kselftest case's FAILED line: its first diagnostic lines, cut at this width.
WHY_LINES = 5
WHY_WIDTH = 400


def fmt_list(names):
    return ", ".join(sorted(names))


class Tally:
    """The counts of the closing line, and what failed."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def ok(self):
        self.passed += 1

    def fail(self, what, why=()):
        """One failure; `why`: lines of the test's own output that say why (printed under it)."""
        self.failed += 1
        self.failures.append((what, list(why)))

    def check(self, ok, what):
        """One gate condition: `what` says what failed when `ok` is false."""
        if ok:
            self.ok()
        else:
            self.fail(what)


class Manifest:
    """tests/expected.toml: the suites and binaries that must run, their floors, allowed skips."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        data = tomllib.loads(self.path.read_text())
        self.models = {m: v["pci_id"].lower() for m, v in data.get("models", {}).items()}
        self.kunit = data.get("kunit", {})
        self.kselftest = data.get("kselftest", {})
        self.example = data.get("example", {})
        self.skips = data.get("skip", [])
        self.passes = data.get("passes", {})
        self.dkms = data.get("dkms", {})
        steps = self.dkms.get("steps", [])
        if self.dkms and (not steps or not all(isinstance(x, str) and x for x in steps)):
            raise ValueError(f"{self.path}: [dkms]: needs steps = a non-empty list of step names")
        for name, entry in self.passes.items():
            if name == "main" or not isinstance(entry.get("devices"), int) or entry["devices"] < 1:
                raise ValueError(f"{self.path}: passes.{name}: needs devices = an integer >= 1 "
                                 f"(and `main` is the one-device pass's name)")
            for flag in ("numa", "switch"):
                if not isinstance(entry.get(flag, False), bool):
                    raise ValueError(f"{self.path}: passes.{name}: {flag} must be true or false")
        for kind in ("kselftest", "example"):
            for name, entry in self.table(kind).items():
                if entry.get("pass", "main") not in ("main", *self.passes):
                    raise ValueError(f"{self.path}: {kind}.{name}: pass {entry['pass']!r} is not in [passes]")
        for name, entry in self.example.items():
            if not isinstance(entry.get("command"), str) or not entry["command"].strip():
                raise ValueError(f"{self.path}: example.{name}: needs command = the guest command that runs it")
            if not isinstance(entry.get("expect", ""), str):
                raise ValueError(f"{self.path}: example.{name}: expect must be a string (a line of its output)")
        for kind, table in (("kunit", self.kunit), ("kselftest", self.kselftest)):
            for name, entry in table.items():
                if not isinstance(entry.get("min_cases", 0), int) or entry.get("min_cases", 0) < 0:
                    raise ValueError(f"{self.path}: {kind}.{name}: min_cases must be an integer >= 0")
        for s in self.skips:
            for key in ("test", "case", "reason"):
                if key not in s:
                    raise ValueError(f"{self.path}: a [[skip]] entry has no {key}: {s}")

    def table(self, kind):
        """The manifest's table of `kind`: kunit, kselftest or example."""
        return {"kunit": self.kunit, "kselftest": self.kselftest, "example": self.example}[kind]

    def required(self, kind, pass_=None):
        """What must run: in pass `pass_` (KUnit only in "main"), or in any pass (None)."""
        names = [n for n, e in self.table(kind).items() if not e.get("optional", False)]
        if pass_ is None:
            return names
        if kind == "kunit":
            return names if pass_ == "main" else []
        return [n for n in names if self.pass_of(n, kind) == pass_]

    def pass_of(self, name, kind="kselftest"):
        return self.table(kind)[name].get("pass", "main")

    def binaries(self, pass_=None):
        """The kselftests that are programs built from tests/kselftest/NAME.c."""
        return [n for n in self.required("kselftest", pass_) if "command" not in self.kselftest[n]]

    def commands(self, pass_=None):
        """`NAME COMMAND...` of the kselftests that are guest commands (e.g. udmactl selftest)."""
        return [f"{n} {self.kselftest[n]['command']}" for n in self.required("kselftest", pass_)
                if "command" in self.kselftest[n]]

    def examples(self, pass_=None):
        """`NAME COMMAND...` of the examples (examples/*.c, the client crate's examples/)."""
        return [f"{n} {self.example[n]['command']}" for n in self.required("example", pass_)]

    def entry(self, kind, name):
        return self.table(kind).get(name)

    def skip_allowed(self, test, case, model):
        for s in self.skips:
            if s["test"] == test and s["case"] in (case, "*") and model in s.get("models", [model]):
                return True
        return False


# ---- KTAP / TAP ----


class Suite:
    """One KTAP (sub)test with its plan, its direct cases and its own verdict."""

    def __init__(self, name):
        self.name = name
        self.plan = None
        self.cases = []  # (ok, name, directive)
        self.verdict = None  # "ok" / "not ok"; None when the suite's result line never came
        self.directive = ""


def failure_lines(said, n=WHY_LINES, width=WHY_WIDTH):
    """What a failed case printed about itself, for its FAILED line: its first `n` diagnostic
    lines (`# ...`) other than the harness's own `RUN`/`OK`/`FAIL` banners, each cut at `width`
    characters; the whole output stays in the pass's output.log."""
    banner = re.compile(r"^#\s+(RUN|OK|FAIL)\s")
    out = []
    for ln in said:
        if banner.match(ln) or not ln[1:].strip():
            continue
        out.append(ln if len(ln) <= width else ln[:width - 3] + "...")
        if len(out) == n:
            break
    return out


def strip_console(text):
    """The console log's lines without their printk timestamps and carriage returns."""
    return [TIMESTAMP_RE.sub("", ln.rstrip("\r")) for ln in text.splitlines()]


def ktap_suites(lines):
    """Every KTAP subtest introduced by `# Subtest: NAME` in `lines`, in order.

    The subtest's plan and cases are at the header's indentation; deeper lines (parameterised
    cases' own results, logs) and unrelated kernel messages are skipped; the subtest's own result
    line is the first `ok N NAME` at a smaller indentation.
    """
    suites = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)# Subtest: (\S+)", lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        suite = Suite(m.group(2))
        j = i + 1
        while j < len(lines):
            line = lines[j]
            body = line.lstrip()
            ind = len(line) - len(body)
            if ind == indent and re.match(r"^# Subtest: ", body):
                break  # a new subtest before this one's result: truncated
            if ind == indent:
                p = PLAN_RE.match(body)
                r = RESULT_RE.match(body)
                if p and suite.plan is None:
                    suite.plan = int(p.group(1))
                elif r:
                    suite.cases.append((r.group(1) == "ok", r.group(3), (r.group(4) or "").upper()))
            elif ind < indent:
                r = RESULT_RE.match(body)
                if r and r.group(3) == suite.name:
                    suite.verdict = r.group(1)
                    suite.directive = (r.group(4) or "").upper()
                    j += 1
                    break
            j += 1
        suites.append(suite)
        i = j
    return suites


def blocks(lines):
    """(kind, name, lines, complete) for each NU-BEGIN/NU-END block of the test plan's output.

    A block that never ends (a new NU-BEGIN or the end of the output came first) is returned with
    complete=False, never dropped.
    """
    out = []
    cur = None
    for line in lines:
        m = re.match(r"^NU-BEGIN (\S+) (\S+)", line)
        if m:
            if cur:
                out.append((cur[0], cur[1], cur[2], False))
            cur = (m.group(1), m.group(2), [])
            continue
        if cur and line.strip() == f"NU-END {cur[0]} {cur[1]}":
            out.append((cur[0], cur[1], cur[2], True))
            cur = None
            continue
        if cur:
            cur[2].append(line)
    if cur:
        out.append((cur[0], cur[1], cur[2], False))
    return out


# ---- dmatest, the kernel's dmaengine test client (tests/kselftest/dmatest_test.c) ----

# The kselftest that runs dmatest and the phases it must log.
DMATEST_TEST = "dmatest_test"
DMATEST_PHASES = ("random", "polled", "size65536", "size65537", "align", "memset", "fault",
                  "after-fault", "unbind", "after-rebind")
DMATEST_PHASE_RE = re.compile(r"neuron_udma-dmatest: phase (\S+) channels (\d+) min (\d+) expect (\w+)")
DMATEST_END_RE = re.compile(r"neuron_udma-dmatest: phase (\S+) end")
DMATEST_SUMMARY_RE = re.compile(r"dmatest: (\S+?)-\w+?\d+: summary (\d+) tests, (\d+) failures")
DMATEST_RESULT_RE = re.compile(r"dmatest: \S+: result #")


def dmatest_phases(lines):
    """The dmatest phases of a console log, in order: dicts with name, channels, min (tests per
    channel), expect (clean, failures, any), tests and failures per channel (from dmatest's own
    summary lines), results (its result lines: one per failed test) and ended."""
    phases, cur = [], None
    for ln in lines:
        m = DMATEST_PHASE_RE.search(ln)
        if m:
            cur = {"name": m.group(1), "channels": int(m.group(2)), "min": int(m.group(3)),
                   "expect": m.group(4), "tests": {}, "failures": {}, "results": 0, "ended": False}
            phases.append(cur)
            continue
        if cur is None:
            continue
        m = DMATEST_END_RE.search(ln)
        if m and m.group(1) == cur["name"]:
            cur["ended"] = True
            cur = None
            continue
        m = DMATEST_SUMMARY_RE.search(ln)
        if m:
            ch = m.group(1)
            cur["tests"][ch] = cur["tests"].get(ch, 0) + int(m.group(2))
            cur["failures"][ch] = cur["failures"].get(ch, 0) + int(m.group(3))
        elif DMATEST_RESULT_RE.search(ln):
            cur["results"] += 1
    return phases


def dmatest_problems(phases):
    """What is wrong with the dmatest phases of one run (empty: nothing)."""
    out = []
    seen = [p["name"] for p in phases]
    for name in DMATEST_PHASES:
        if name not in seen:
            out.append(f"dmatest phase {name} did not run")
    for p in phases:
        what = f"dmatest phase {p['name']}"
        if not p["ended"]:
            out.append(f"{what}: no end marker (the run hung or crashed?)")
            continue
        fails = sum(p["failures"].values())
        if p["expect"] == "clean":
            if len(p["tests"]) != p["channels"]:
                out.append(f"{what}: summaries of {len(p['tests'])} channels, {p['channels']} expected")
            for ch, n in sorted(p["tests"].items()):
                if n < p["min"]:
                    out.append(f"{what}: {ch} ran {n} tests, fewer than {p['min']}")
            if fails or p["results"]:
                out.append(f"{what}: {fails} failures, {p['results']} result lines")
        elif p["expect"] == "failures" and not fails:
            out.append(f"{what}: the injected fault failed no test")
    return out


def dmatest_counts(phases):
    """`phase: channel=tests/failures ...` lines for the summary."""
    return [f"{p['name']}: " + " ".join(f"{ch}={p['tests'][ch]}/{p['failures'].get(ch, 0)}"
                                       for ch in sorted(p["tests"])) for p in phases]


# ---- one model's run ----


class Run:
    def __init__(self, label, d, manifest, tally):
        self.label = label
        self.model, _, self.pass_ = label.partition(":")
        self.pass_ = self.pass_ or "main"
        self.d = pathlib.Path(d)
        self.m = manifest
        self.t = tally
        self.console = self.read("console.log")
        self.output = self.read("output.log")
        self.clines = strip_console(self.console)
        self.olines = [ln.rstrip("\r") for ln in self.output.splitlines()]
        self.cases = {"kunit": 0, "kselftest": 0, "example": 0}
        self.ran = {"kunit": set(), "kselftest": set(), "example": set()}
        self.seconds = {}  # kselftest name -> seconds it ran (NU-SECONDS)
        self.example_seconds = {}  # example name -> seconds it ran
        self.uptime = {}  # "start"/"end" -> seconds since boot (NU-UPTIME)

    def read(self, name):
        p = self.d / name
        return p.read_text(errors="replace") if p.exists() else ""

    def fail(self, what, why=()):
        self.t.fail(f"{self.label}: {what}", why)

    def check(self, ok, what):
        self.t.check(ok, f"{self.label}: {what}")

    def case(self, kind, test, case, ok, directive, why=()):
        """Counts one case; a skip outside the manifest's allow-list fails. `why`: the case's
        diagnostic lines, shown under its failure."""
        self.cases[kind] += 1
        what = f"{kind} {test}: {case}"
        if directive == "SKIP":
            if self.m.skip_allowed(f"{kind} {test}", case, self.model):
                self.t.skipped += 1
            else:
                self.fail(f"{what}: skipped, and not allowed to skip on {self.model} "
                          f"(fix it, or add a [[skip]] entry with the reason to tests/expected.toml)")
        elif ok:
            self.t.ok()
        else:
            self.fail(f"{what}: failed", why)

    def plan_checks(self, kind, name, plan, ncases, verdict_ok, where):
        entry = self.m.entry(kind, name)
        floor = entry.get("min_cases", 0) if entry else 0
        self.check(plan is not None, f"{kind} {name}: no plan line (1..N) in {where}")
        if plan is not None:
            self.check(plan == ncases, f"{kind} {name}: plan says {plan} cases, {ncases} reported in {where}")
        self.check(ncases >= floor,
                   f"{kind} {name}: {ncases} cases in {where}, tests/expected.toml expects at least {floor}")
        self.check(verdict_ok, f"{kind} {name}: its own result is not ok in {where}")

    def kunit_block(self, name, lines, complete):
        self.ran["kunit"].add(name)
        if not complete:
            self.fail(f"kunit {name}: its results end early (no NU-END marker)")
        found = [s for s in ktap_suites(lines) if s.name == name]
        if not found:
            self.fail(f"kunit {name}: no KTAP subtest in its debugfs results")
            return
        s = found[0]
        for ok, case, directive in s.cases:
            self.case("kunit", name, case, ok, directive)
        suite_skip = s.directive == "SKIP"
        if suite_skip and not self.m.skip_allowed(f"kunit {name}", "*", self.model):
            self.fail(f"kunit {name}: the whole suite skipped")
        self.plan_checks("kunit", name, s.plan, len(s.cases), s.verdict == "ok" or suite_skip,
                         "debugfs results")
        # The console shows what KUnit printed at insmod; it must agree.
        con = [c for c in ktap_suites(self.clines) if c.name == name]
        if not con:
            self.fail(f"kunit {name}: not on the console (KUnit prints every suite at insmod)")
            return
        for c in con:
            self.check(c.verdict == "ok" or (suite_skip and c.directive == "SKIP"),
                       f"kunit {name}: the console shows {c.verdict or 'no result line'} for the suite")
            self.check((c.plan, len(c.cases)) == (s.plan, len(s.cases)),
                       f"kunit {name}: the console shows plan {c.plan} with {len(c.cases)} cases, "
                       f"debugfs plan {s.plan} with {len(s.cases)}")
            bad = [case for ok, case, d in c.cases if not ok and d != "SKIP"]
            self.check(not bad, f"kunit {name}: the console shows failed cases: {fmt_list(bad)}")

    def kselftest_block(self, name, lines, complete):
        self.ran["kselftest"].add(name)
        if not complete:
            self.fail(f"kselftest {name}: its output ends early (no NU-END marker: it crashed or hung?)")
        plan = None
        rc = None
        ncases = 0
        said = []  # the diagnostic lines since the last result line
        for line in lines:
            if line.startswith("#"):
                said.append(line)
            if line.startswith("NU-RC "):
                rc = int(line.split()[1])
                continue
            if line.startswith("NU-SECONDS "):
                try:
                    self.seconds[name] = int(line.split()[1])
                except (IndexError, ValueError):
                    pass
                continue
            p = PLAN_RE.match(line)
            if p and plan is None:
                plan = int(p.group(1))
                continue
            r = RESULT_RE.match(line)
            if r:
                self.case("kselftest", name, r.group(3), r.group(1) == "ok", (r.group(4) or "").upper(),
                          failure_lines(said))
                said = []
                ncases += 1
        self.check(rc == 0, f"kselftest {name}: exit status {rc if rc is not None else 'missing'}")
        self.plan_checks("kselftest", name, plan, ncases, True, "its TAP output")

    def example_block(self, name, lines, complete):
        """One example: a program, not a TAP test; one case, passed when it ran to its end,
        exited 0 and printed its `expect` line (if the manifest gives one)."""
        self.ran["example"].add(name)
        self.cases["example"] += 1
        rc = None
        for line in lines:
            if line.startswith("NU-RC "):
                rc = int(line.split()[1])
            elif line.startswith("NU-SECONDS "):
                try:
                    self.example_seconds[name] = int(line.split()[1])
                except (IndexError, ValueError):
                    pass
        out = [ln for ln in lines if not ln.startswith(("NU-RC ", "NU-SECONDS "))]
        last = next((ln.strip() for ln in reversed(out) if ln.strip()), "no output")
        entry = self.m.entry("example", name) or {}
        expect = entry.get("expect", "")
        problems = []
        if not complete:
            problems.append("its output ends early (no NU-END marker: it crashed or hung?)")
        if rc != 0:
            problems.append(f"exit status {rc if rc is not None else 'missing'}")
        if expect and not any(expect in ln for ln in out):
            problems.append(f"no line with {expect!r} in its output")
        self.check(not problems, f"example {name}: {'; '.join(problems)}; its last line: {last}")

    def check_all(self):
        for kind, name, lines, complete in blocks(self.olines):
            if kind == "kunit":
                self.kunit_block(name, lines, complete)
            elif kind == "kselftest":
                self.kselftest_block(name, lines, complete)
            elif kind == "example":
                self.example_block(name, lines, complete)
        # Every suite and binary the manifest requires ran; nothing ran that it does not name.
        console = {}
        for c in ktap_suites(self.clines):
            console.setdefault(c.name, []).append(c)
        for kind in ("kunit", "kselftest", "example"):
            required = set(self.m.required(kind, self.pass_))
            if kind == "example" and not self.m.example and not self.ran[kind]:
                continue  # a manifest without examples (older runs): nothing to count
            missing = required - self.ran[kind]
            reported = {ln.split()[2] for ln in self.olines
                        if re.match(rf"^NU-(MISSING|NOT-EXECUTABLE) {kind} \S+", ln)}
            for n in sorted(missing):
                how = "missing from the guest" if n in reported else "did not run"
                if kind == "kunit" and n in console:
                    how += "; the console shows " + ", ".join(c.verdict or "no result" for c in console[n])
                self.fail(f"{kind} {n}: {how} (tests/expected.toml requires it)")
            if not missing:
                self.t.ok()
            unknown = self.ran[kind] - set(self.m.table(kind))
            self.check(not unknown, f"{kind} {fmt_list(unknown)}: ran but not named in tests/expected.toml "
                                    f"(add it there)")
            elsewhere = self.ran[kind] - required - unknown
            self.check(not elsewhere, f"{kind} {fmt_list(elsewhere)}: ran in the {self.pass_} pass, "
                                      f"tests/expected.toml puts it in another")
        # A suite KUnit ran at load whose debugfs results were not printed (and not required).
        for n in sorted(console):
            if not n.startswith("neuron_udma") or n in self.ran["kunit"]:
                continue
            if self.pass_ != "main":
                self.fail(f"kunit {n}: ran in the {self.pass_} pass (its KUnit suites are filtered out)")
            elif n not in self.m.required("kunit"):
                self.fail(f"kunit {n}: on the console but its debugfs results were not printed")
        self.dmatest = []
        if DMATEST_TEST in self.m.required("kselftest", self.pass_):
            self.dmatest = dmatest_phases(self.clines)
            problems = dmatest_problems(self.dmatest)
            for pb in problems:
                self.fail(pb)
            if not problems:
                self.t.ok()
        self.infra()

    def marker(self, prefix):
        """The rest of the last test plan output line starting with `prefix`, or None."""
        val = None
        for ln in self.olines:
            if ln.startswith(prefix):
                val = ln[len(prefix):].strip()
        return val

    def infra(self):
        # The device, and that it is the model's.
        bound = [m.group(1) for m in (re.search(r"NU-BOUND \S+ ?(\S*)", ln) for ln in self.clines) if m]
        self.check(bool(bound), "the device did not bind (see console.log)")
        want = self.m.models.get(self.model)
        if want is None:
            self.fail(f"model {self.model} is not in tests/expected.toml [models]")
        elif bound:
            got = bound[-1].lower() or "not printed"
            self.check(got == want, f"the bound device is {got}, the {self.model} model is {want} "
                                    f"(logs of another model's run?)")
        if self.pass_ != "main":
            self.devices(want)
        image = self.marker("NU-IMAGE")
        self.check(image == "root=755 tmp=1777 dev=666 udma1=1001 ok",
                   f"the guest image for unprivileged users: {image or 'not reported'} "
                   f"(expected / 0755, /tmp 1777, /dev/neuron_udma0 0666, udma1 (uid 1001) can open it)")
        self.check(self.marker("NU-SYSCTL") == "hung_task_timeout_secs=60 watchdog_thresh=30",
                   f"hung-task/soft-lockup detector settings: {self.marker('NU-SYSCTL') or 'not reported'} "
                   f"(scripts/vm-run sets 60 and 30 on the kernel command line)")
        self.check(self.marker("NU-RMMOD") == "ok", "the driver did not unload (rmmod)")
        reload = self.marker("NU-RELOAD")
        self.check(reload is not None and reload.startswith("ok"),
                   f"the second load/unload cycle: {reload or 'did not run'}")
        # The sanitizers were on at boot and still are at the end.
        for what, rx in BOOT_EVIDENCE.items():
            self.check(any(rx.search(ln) for ln in self.clines), f"the boot log does not show {what}")
        off = [ln for ln in self.clines + self.olines if SANITIZER_OFF_RE.search(ln)]
        self.check(not off, f"a sanitizer disabled itself: {off[0].strip() if off else ''}")
        for when in ("after-rmmod", "after-reload", "final"):
            state = self.marker(f"NU-DMA-API {when}")
            self.check(state == "disabled=N error_count=0",
                       f"DMA-API debugging {when}: {state or 'not reported'} (expected disabled=N error_count=0)")
        self.check(self.marker("NU-KMEMLEAK") == "scans ok ok",
                   f"kmemleak {self.marker('NU-KMEMLEAK') or 'scans not run'} (expected both scans accepted)")
        report = [b for b in blocks(self.olines) if b[0] == "kmemleak"]
        if not report or not report[-1][3]:
            self.fail("kmemleak: no complete report after the scans")
        else:
            leaks = [ln for ln in report[-1][2] if ln.strip()]
            self.check(not leaks, f"kmemleak reports {sum('unreferenced object' in ln for ln in leaks)} "
                                  f"leaked objects after the unloads (see output.log)")
        self.check("NU-DONE" in self.olines, "the test plan did not complete (see output.log)")
        splats = splat_lines(self.clines) + splat_lines(self.olines)
        more = f" (and {len(splats) - 1} more lines, see console.log and output.log)" if len(splats) > 1 else ""
        self.check(not splats, f"kernel splat: {splats[0] if splats else ''}{more}")
        self.splats = splats

    def devices(self, want):
        """An extra pass: the guest had the pass's devices, all of the model's, all bound."""
        entry = self.m.passes.get(self.pass_)
        if entry is None:
            self.fail(f"pass {self.pass_} is not in tests/expected.toml [passes]")
            return
        devs = [ln.split()[1:] for ln in self.olines if ln.startswith("NU-DEVICE ")]
        self.check(len(devs) == entry["devices"],
                   f"{len(devs)} Neuron devices in the guest (NU-DEVICE lines), the {self.pass_} pass "
                   f"needs {entry['devices']}")
        wrong = [" ".join(d) for d in devs if len(d) != 3 or d[1].lower() != want or d[2] != "neuron_udma"]
        self.check(not wrong, f"devices not the {self.model} model's ({want}) or not bound to neuron_udma: "
                              f"{'; '.join(wrong)}")

    def read_uptime(self):
        for ln in self.olines:
            f = ln.split()
            if len(f) == 3 and f[0] == "NU-UPTIME":
                try:
                    self.uptime[f[1]] = float(f[2])
                except ValueError:
                    pass

    def time_text(self):
        """Where the guest's time went: boot, module load and KUnit before the test plan, the
        kselftests, the rest of the plan (unload, reload, kmemleak scans). Empty without the
        NU-UPTIME lines (a run that ended early)."""
        self.read_uptime()
        if "start" not in self.uptime or "end" not in self.uptime:
            return ""
        start, end = self.uptime["start"], self.uptime["end"]
        tests = sum(self.seconds.values())
        examples = sum(self.example_seconds.values())
        ex = f"examples {examples} s, " if self.example_seconds else ""
        return (f"guest time: {start:.0f} s before the test plan ({self.boot_parts()}), "
                f"kselftests {tests} s, {ex}the rest of the plan (unload, reload, leak scans) "
                f"{max(0.0, end - start - tests - examples):.0f} s")

    def boot_parts(self):
        return "boot, module load" + (", KUnit" if self.ran["kunit"] else "")

    def write_times(self, path):
        """Appends `label kselftest seconds` lines (every kselftest of the run) to `path`."""
        self.read_uptime()
        with open(path, "a") as f:
            if "start" in self.uptime:
                f.write(f"{self.label} ({self.boot_parts()}) {self.uptime['start']:.0f}\n")
            for n, sec in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
                f.write(f"{self.label} {n} {sec}\n")
            for n, sec in sorted(self.example_seconds.items(), key=lambda kv: -kv[1]):
                f.write(f"{self.label} example {n} {sec}\n")

    def summary(self):
        examples = f"{len(self.ran['example'])} examples, " if self.m.example or self.ran["example"] else ""
        print(f"{self.label}: {len(self.ran['kunit'])} KUnit suites ({self.cases['kunit']} cases), "
              f"{len(self.ran['kselftest'])} kselftests ({self.cases['kselftest']} cases), "
              f"{examples}{boots_text(self.d)}")
        slow = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:3]
        if slow:
            print(f"{self.label}:   slowest kselftests: "
                  + ", ".join(f"{n} {s} s" for n, s in slow)
                  + f" (all {sum(self.seconds.values())} s)")
        t = self.time_text()
        if t:
            print(f"{self.label}:   {t}")
        for ln in dmatest_counts(getattr(self, "dmatest", [])):
            print(f"{self.label}:   dmatest {ln}")
        for s in self.splats[:20]:
            print(f"{self.label}:   splat: {s}")


# ---- the host-side stages ----


def cargo_counts(path, tally):
    text = pathlib.Path(path).read_text(errors="replace")
    runs = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", text)
    passed = sum(int(r[1]) for r in runs)
    failed = sum(int(r[2]) for r in runs)
    tally.passed += passed
    tally.failed += failed
    if failed:
        tally.failures.append(f"cargo test: {failed} failed (see build/check/cargo-test.log)")
    if not runs:
        tally.fail("cargo test: no result line (it did not build? see build/check/cargo-test.log)")
    print(f"cargo test: {passed} passed, {failed} failed")


def lint_counts(path, tally):
    """shellcheck, one result per script (NU-LINT lines of scripts/check)."""
    lines = pathlib.Path(path).read_text(errors="replace").splitlines() if pathlib.Path(path).exists() else []
    n = 0
    for ln in lines:
        m = re.match(r"^NU-LINT (ok|failed) (\S+)", ln)
        if not m:
            continue
        n += 1
        findings = [x for x in lines if x.startswith(m.group(2) + ":")]
        tally.check(m.group(1) == "ok", f"shellcheck {m.group(2)}: {len(findings)} findings, first: "
                                        f"{findings[0] if findings else '(see build/check/shellcheck.log)'}")
    if n == 0:
        tally.fail("shellcheck did not run (see build/check/shellcheck.log)")
    print(f"shellcheck: {n} scripts")


def unittest_counts(path, tally):
    text = pathlib.Path(path).read_text(errors="replace") if pathlib.Path(path).exists() else ""
    ran = re.search(r"^Ran (\d+) tests? in", text, re.M)
    if not ran:
        tally.fail("parser unit tests did not run (see build/check/parser-tests.log)")
        return
    n = int(ran.group(1))
    bad = re.findall(r"^(?:FAIL|ERROR): (\S+)", text, re.M)
    skipped = re.search(r"skipped=(\d+)", text)
    nskip = int(skipped.group(1)) if skipped else 0
    tally.passed += n - len(bad) - nskip
    tally.skipped += nskip
    for b in bad:
        tally.fail(f"parser unit test {b} (see build/check/parser-tests.log)")
    if not bad and not re.search(r"^OK\b", text, re.M):
        tally.fail("parser unit tests: no OK line (see build/check/parser-tests.log)")
    print(f"parser unit tests: {n - len(bad) - nskip} passed, {len(bad)} failed")


def dkms_counts(path, manifest, tally):
    """The DKMS stage: one result per step of the manifest's [dkms] (its `NU-DKMS ok STEP` line),
    and one for the exit status of scripts/dkms-check (scripts/check's NU-DKMS-EXIT line)."""
    p = pathlib.Path(path)
    if not p.exists():
        tally.fail("dkms: the DKMS stage did not run (no build/check/dkms.log)")
        print("dkms: did not run")
        return
    lines = p.read_text(errors="replace").splitlines()
    done = {m.group(1) for m in (re.match(r"^NU-DKMS ok (\S+)", ln) for ln in lines) if m}
    errors = [ln.strip() for ln in lines if re.search(r"\berror: |^NU-DKMS failed ", ln)]
    why = f": {errors[-1]}" if errors else ""
    steps = manifest.dkms.get("steps", [])
    for step in steps:
        tally.check(step in done, f"dkms {step}: did not pass (build/check/dkms.log){why}")
    rc = [ln.split()[1] for ln in lines if re.match(r"^NU-DKMS-EXIT -?\d+\s*$", ln)]
    tally.check(rc == ["0"], f"dkms: scripts/dkms-check exited {rc[-1] if rc else '(no NU-DKMS-EXIT line)'}{why}")
    secs = [ln.split()[1] for ln in lines if re.match(r"^NU-DKMS-SECONDS \d+\s*$", ln)]
    print(f"dkms: {sum(s in done for s in steps)}/{len(steps)} steps"
          f"{f' in {secs[-1]} s' if secs else ''} (build, install, load, demo copy through DKMS)"
          f"{boots_text(path_of_line(lines, 'NU-DKMS-VM-LOGS'), ', ')}")


def splats(d):
    """The splat lines of the console and test output logs of run directory `d`."""
    out = []
    for name in ("console.log", "output.log"):
        p = pathlib.Path(d) / name
        if p.exists():
            out += splat_lines(strip_console(p.read_text(errors="replace")))
    return out


def path_of_line(lines, tag):
    """The path of the last `TAG path` line among `lines`, or None."""
    paths = [ln.split(None, 1)[1].strip() for ln in lines if ln.startswith(tag + " ")]
    return paths[-1] if paths else None


def boots_text(d, prefix=""):
    """How many boots the run in directory `d` needed (scripts/vm-run's boots.log), and where the
    console of each discarded boot is: a retry is never silent. Empty for `d` None."""
    if d is None:
        return ""
    return prefix + _boots_text(d)


def _boots_text(d):
    p = pathlib.Path(d) / "boots.log"
    try:
        n = int(p.read_text().strip())
    except (OSError, ValueError):
        return "boots: unknown (no boots.log)"
    if n == 1:
        return "1 boot"
    kept = ", ".join(str(pathlib.Path(d) / f"console-boot{i}.log") for i in range(1, n))
    return f"{n} boots (a splat while booting, before the module loaded: {kept})"


def boot_splat(d):
    """Whether the console log of run directory `d` shows a splat before the module loaded."""
    p = pathlib.Path(d) / "console.log"
    console = p.read_text(errors="replace") if p.exists() else ""
    for line in console.splitlines():
        # The kernel command line may name the module (kunit.filter_glob=... of an extra pass):
        # that is not the module loading.
        if "neuron_udma" in line and "command line:" not in line.lower():
            return False
        if SPLAT_RE.search(line):
            return True
    return False


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=str(MANIFEST))
    ap.add_argument("--boot-splat", metavar="DIR")
    ap.add_argument("--splats", metavar="DIR")
    ap.add_argument("--list", choices=("kunit", "kselftest", "guest-commands", "examples", "passes", "splats"))
    ap.add_argument("--pass", dest="pass_", metavar="PASS")
    ap.add_argument("--lint")
    ap.add_argument("--unittest")
    ap.add_argument("--cargo")
    ap.add_argument("--dkms")
    ap.add_argument("--toolchain", metavar="FILE", help="scripts/toolchain-root --status output")
    ap.add_argument("--times", metavar="FILE",
                    help="append every kselftest's seconds (and each run's boot) to FILE")
    ap.add_argument("runs", nargs="*", metavar="MODEL=DIR")
    args = ap.parse_args(argv)
    if args.boot_splat:
        return 0 if boot_splat(args.boot_splat) else 1
    if args.splats:
        found = splats(args.splats)
        if not (pathlib.Path(args.splats) / "console.log").exists():
            print(f"no console.log in {args.splats}")
            return 1
        for ln in found:
            print(f"splat: {ln}")
        return 1 if found else 0
    manifest = Manifest(args.manifest)
    if args.list:
        names = {"kunit": lambda: manifest.required("kunit", args.pass_),
                 "kselftest": lambda: manifest.binaries(args.pass_),
                 "guest-commands": lambda: manifest.commands(args.pass_),
                 "examples": lambda: manifest.examples(args.pass_),
                 "passes": lambda: [" ".join([n, str(e["devices"])] + [f for f in ("numa", "switch") if e.get(f)])
                                    for n, e in manifest.passes.items()],
                 # For the guest's `grep -E -f` (tests/guest/init): POSIX ERE with GNU's \b.
                 "splats": lambda: SPLATS}[args.list]()
        print("\n".join(names))
        return 0
    tally = Tally()
    if args.toolchain:
        p = pathlib.Path(args.toolchain)
        for ln in (p.read_text(errors="replace").splitlines() if p.exists() else ["(no record)"]):
            print(f"toolchain: {ln}")
    if args.lint:
        lint_counts(args.lint, tally)
    if args.unittest:
        unittest_counts(args.unittest, tally)
    if args.cargo:
        cargo_counts(args.cargo, tally)
    if args.dkms:
        dkms_counts(args.dkms, manifest, tally)
    elif manifest.dkms and args.runs:
        tally.fail("dkms: the DKMS stage did not run (tests/expected.toml [dkms]; no --dkms log given)")
    given = {r.partition("=")[0] for r in args.runs}
    for model in sorted({g.partition(":")[0] for g in given}):
        for p in manifest.passes:
            if f"{model}:{p}" not in given:
                tally.fail(f"{model}:{p}: the {p} pass did not run (tests/expected.toml [passes.{p}])")
    for r in args.runs:
        label, _, d = r.partition("=")
        if not (pathlib.Path(d) / "console.log").exists():
            # Nothing booted: one failure that says so, not one per suite and check.
            tally.fail(f"{label}: the VM did not boot (no console.log): the build of the model, "
                       f"kernel, module or kselftests, or the VM start, failed: see the messages "
                       f"above the summary")
            continue
        one = Run(label, d, manifest, tally)
        one.check_all()
        one.summary()
        if args.times:
            one.write_times(args.times)
    for f, why in tally.failures:
        print(f"FAILED: {f}")
        for ln in why:
            print(f"  | {ln}")
    line = f"{tally.passed} passed, {tally.failed} failed"
    if tally.skipped:
        line += f", {tally.skipped} skipped"
    print(line)
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
