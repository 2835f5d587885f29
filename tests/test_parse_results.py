#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Unit tests of the gate (tests/parse-results.py), run by `make check`.

tests/fixtures/{trn1,trn2}/ hold the console and test-plan logs of a real `make check` run of
2026-11-30, trimmed: the boot messages that carry no result are cut, and so are the two things that
failed that run and are not the parser's business (the kmemleak report of a 32-byte object the
driver's device registry leaked, and the `NU-MISSING kselftest` line of the security kselftest,
which did not exist yet: today isolation_test and stalled_queue_test); tests/fixtures/expected.toml is the manifest of that run. Each test derives a broken run by a small edit of those logs and checks that
the gate fails it, saying what broke. run: python3 tests/test_parse_results.py [-v]
"""

import contextlib
import importlib.util
import io
import pathlib
import re
import shutil
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no tests/__pycache__ from importing the parser

TESTS = pathlib.Path(__file__).resolve().parent
TOP = TESTS.parent
FIXTURES = TESTS / "fixtures"
FIXTURE_MANIFEST = FIXTURES / "expected.toml"

_spec = importlib.util.spec_from_file_location("parse_results", TESTS / "parse-results.py")
pr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pr)


def drop_block(text, kind, name):
    """The test plan output without the NU-BEGIN/NU-END block of one suite or binary."""
    out, skipping = [], False
    for ln in text.splitlines(keepends=True):
        if ln.startswith(f"NU-BEGIN {kind} {name}"):
            skipping = True
        if not skipping:
            out.append(ln)
        if skipping and ln.startswith(f"NU-END {kind} {name}"):
            skipping = False
    return "".join(out)


def block_of(text, kind, name):
    m = re.search(rf"^NU-BEGIN {kind} {name}\n(.*?)^NU-END {kind} {name}\n", text, re.S | re.M)
    assert m, f"no {kind} {name} block in the fixture"
    return m


def sub1(pattern, repl, text, flags=re.M):
    """re.sub that must change something (a fixture edit that misses proves nothing)."""
    new, n = re.subn(pattern, repl, text, count=1, flags=flags)
    assert n == 1, f"pattern {pattern!r} not found"
    return new


class GateTest(unittest.TestCase):
    """Helpers: copy the fixture runs to a temporary directory, edit them, run the gate."""

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="nu-gate-test."))
        self.addCleanup(shutil.rmtree, self.tmp)
        for model in ("trn1", "trn2"):
            shutil.copytree(FIXTURES / model, self.tmp / model)
        self.manifest = self.tmp / "expected.toml"
        shutil.copy(FIXTURE_MANIFEST, self.manifest)

    def read(self, model, log):
        return (self.tmp / model / log).read_text()

    def write(self, model, log, text):
        (self.tmp / model / log).write_text(text)

    def edit(self, model, log, fn):
        self.write(model, log, fn(self.read(model, log)))

    def gate(self, runs=None, extra=()):
        runs = runs or [f"{m}={self.tmp / m}" for m in ("trn1", "trn2")]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = pr.run(["--manifest", str(self.manifest), *extra, *runs])
        return rc, out.getvalue()

    def assertFails(self, *needles, runs=None):
        rc, out = self.gate(runs)
        self.assertEqual(rc, 1, f"the gate passed a broken run:\n{out}")
        last = out.strip().splitlines()[-1]
        self.assertRegex(last, r"^\d+ passed, [1-9]\d* failed")
        failures = "\n".join(ln for ln in out.splitlines() if ln.startswith("FAILED:"))
        for n in needles:
            self.assertIn(n, failures, f"no failure mentions {n!r}:\n{out}")
        return out


class TestPassingRun(GateTest):
    def test_fixture_passes(self):
        rc, out = self.gate()
        self.assertEqual(rc, 0, out)
        self.assertRegex(out.strip().splitlines()[-1], r"^\d+ passed, 0 failed$")

    def test_counts_every_case(self):
        _, out = self.gate()
        for model in ("trn1", "trn2"):
            m = re.search(rf"^{model}: (\d+) KUnit suites \((\d+) cases\), (\d+) kselftests \((\d+) cases\)",
                          out, re.M)
            self.assertTrue(m, out)
            man = pr.Manifest(self.manifest)
            self.assertEqual(int(m.group(1)), len(man.required("kunit")))
            self.assertEqual(int(m.group(3)), len(man.required("kselftest")))


    def test_slowest_kselftests(self):
        # NU-SECONDS of each kselftest (tests/guest/run-tests): the summary names the slowest.
        self.edit("trn1", "output.log", lambda t: t.replace(
            "NU-END kselftest uapi_test\n", "NU-SECONDS 95\nNU-END kselftest uapi_test\n").replace(
            "NU-END kselftest pci_bind_test\n", "NU-SECONDS 7\nNU-END kselftest pci_bind_test\n"))
        rc, out = self.gate()
        self.assertEqual(rc, 0, out)
        self.assertIn("trn1:   slowest kselftests: uapi_test 95 s, pci_bind_test 7 s (all 102 s)", out)
        self.assertNotIn("trn2:   slowest", out)

    def test_where_the_guest_time_went(self):
        # NU-UPTIME start/end (tests/guest/run-tests): the summary splits the guest's time, and
        # --times writes every kselftest's seconds.
        self.edit("trn1", "output.log", lambda t: ("NU-UPTIME start 61.4\n" + t).replace(
            "NU-DONE", "NU-UPTIME end 300.2\nNU-DONE").replace(
            "NU-END kselftest uapi_test\n", "NU-SECONDS 95\nNU-END kselftest uapi_test\n").replace(
            "NU-END kselftest pci_bind_test\n", "NU-SECONDS 7\nNU-END kselftest pci_bind_test\n"))
        times = self.tmp / "times.txt"
        rc, out = self.gate(extra=("--times", str(times)))
        self.assertEqual(rc, 0, out)
        self.assertIn("trn1:   guest time: 61 s before the test plan (boot, module load, KUnit), kselftests "
                      "102 s, the rest of the plan (unload, reload, leak scans) 137 s", out)
        self.assertNotIn("trn2:   guest time", out)
        lines = times.read_text().splitlines()
        self.assertEqual(lines[:3], ["trn1 (boot, module load, KUnit) 61", "trn1 uapi_test 95",
                                     "trn1 pci_bind_test 7"])


class TestMissingTests(GateTest):
    def test_four_kunit_suites_gone(self):
        # The debugfs results of four suites are not printed; the console still shows that one of
        # them failed.
        gone = ["neuron_udma_arch", "neuron_udma_desc", "neuron_udma_live", "neuron_udma_ring"]
        for s in gone:
            self.edit("trn1", "output.log", lambda t, s=s: drop_block(t, "kunit", s))
        self.edit("trn1", "console.log", lambda t: sub1(r"^(\[[ \d.]+\] )?ok (\d+) neuron_udma_live$",
                                                        r"\1not ok \2 neuron_udma_live", t))
        out = self.assertFails(*[f"trn1: kunit {s}: did not run" for s in gone])
        self.assertIn("the console shows not ok", out)

    def test_abi_kselftests_gone(self):
        for b in ("uapi_test", "uapi_unbind_test"):
            self.edit("trn1", "output.log", lambda t, b=b: drop_block(t, "kselftest", b))
        self.assertFails("trn1: kselftest uapi_test: did not run",
                         "trn1: kselftest uapi_unbind_test: did not run")

    def test_guest_reports_missing_binary(self):
        self.edit("trn2", "output.log", lambda t: drop_block(t, "kselftest", "pci_bind_test"))
        self.edit("trn2", "output.log", lambda t: "NU-MISSING kselftest pci_bind_test\n" + t)
        self.assertFails("trn2: kselftest pci_bind_test: missing from the guest")

    def test_manifest_names_a_binary_that_never_ran(self):
        self.manifest.write_text(self.manifest.read_text() + "\n[kselftest.isolation_test]\nmin_cases = 1\n")
        self.assertFails("trn1: kselftest isolation_test: did not run",
                         "trn2: kselftest isolation_test: did not run")

    def test_unnamed_suite_fails(self):
        extra = ("NU-BEGIN kunit neuron_udma_new\nKTAP version 1\n1..1\n    KTAP version 1\n"
                 "    # Subtest: neuron_udma_new\n    1..1\n    ok 1 works\nok 1 neuron_udma_new\n"
                 "NU-END kunit neuron_udma_new\n")
        self.edit("trn1", "output.log", lambda t: extra + t)
        self.assertFails("kunit neuron_udma_new: ran but not named in tests/expected.toml")

    def test_fewer_cases_than_the_floor(self):
        self.manifest.write_text(re.sub(r"(\[kselftest\.uapi_test\]\nmin_cases = )\d+", r"\g<1>999",
                                        self.manifest.read_text()))
        self.assertFails("kselftest uapi_test:", "expects at least 999")


class TestNoBoot(GateTest):
    def test_build_failure_is_one_failure(self):
        # The VM run stopped before booting (e.g. a kselftest did not compile): no console.log.
        shutil.rmtree(self.tmp / "trn1")
        (self.tmp / "trn1").mkdir()
        out = self.assertFails("trn1: the VM did not boot (no console.log)")
        trn1 = [ln for ln in out.splitlines() if ln.startswith("FAILED: trn1")]
        self.assertEqual(len(trn1), 1, out)


class TestPlansAndVerdicts(GateTest):
    def test_kunit_plan_8_with_7_cases_and_suite_not_ok(self):
        def edit(t):
            m = block_of(t, "kunit", "neuron_udma_live")
            body = m.group(1)
            self.assertRegex(body, r"(?m)^\s+1\.\.8$")
            body = sub1(r"^    ok 8 .*\n", "", body)
            body = sub1(r"^ok 1 neuron_udma_live$", "not ok 1 neuron_udma_live", body)
            return t[:m.start(1)] + body + t[m.end(1):]
        self.edit("trn1", "output.log", edit)
        self.assertFails("kunit neuron_udma_live: plan says 8 cases, 7 reported",
                         "kunit neuron_udma_live: its own result is not ok")

    def test_console_disagrees_with_debugfs(self):
        self.edit("trn2", "console.log", lambda t: sub1(r"^(\[[ \d.]+\] )?ok (\d+) neuron_udma_ring$",
                                                        r"\1not ok \2 neuron_udma_ring", t))
        self.assertFails("trn2: kunit neuron_udma_ring: the console shows not ok")

    def test_failed_case(self):
        def edit(t):
            m = block_of(t, "kselftest", "uapi_test")
            return t[:m.start()] + sub1(r"^ok 1 (\S+)$", r"not ok 1 \1", m.group(0)) + t[m.end():]
        self.edit("trn1", "output.log", edit)
        self.assertFails("trn1: kselftest uapi_test:", ": failed")

    def test_failed_case_says_why(self):
        """A failed case's own diagnostic lines stand under its FAILED line (CI shows only the
        summary), without the harness's RUN banner, the lines of the cases before it, or more
        than WHY_LINES of them."""
        long = "x" * 1000
        def edit(t):
            m = block_of(t, "kselftest", "uapi_test")
            body = sub1(r"^ok 2 (\S+)$",
                        "#  RUN           uapi.second ...\n# uapi_test.c:42:second:Expected 0 (0) == r (-22)\n"
                        + "".join(f"# detail {i} {long}\n" for i in range(9)) + r"not ok 2 \1", m.group(0))
            return t[:m.start()] + body + t[m.end():]
        self.edit("trn1", "output.log", edit)
        out = self.assertFails("trn1: kselftest uapi_test:")
        lines = out.splitlines()
        i = next(k for k, ln in enumerate(lines) if ln.startswith("FAILED: trn1: kselftest uapi_test:"))
        why = [ln for ln in lines[i + 1:i + 1 + pr.WHY_LINES + 1] if ln.startswith("  | ")]
        self.assertEqual(len(why), pr.WHY_LINES, out)
        self.assertEqual(why[0], "  | # uapi_test.c:42:second:Expected 0 (0) == r (-22)")
        self.assertTrue(why[1].startswith("  | # detail 0 xxx") and why[1].endswith("..."), why[1])
        self.assertLessEqual(max(len(w) for w in why), pr.WHY_WIDTH + 4)
        self.assertNotIn("RUN", "\n".join(why))

    def test_kselftest_block_lost_its_end_marker(self):
        def edit(t):
            m = block_of(t, "kselftest", "pci_bind_test")
            body = sub1(r"^ok 1 (\S+)$", r"not ok 1 \1", m.group(0))
            body = body.replace("NU-END kselftest pci_bind_test\n", "")
            return t[:m.start()] + body + t[m.end():]
        self.edit("trn1", "output.log", edit)
        self.assertFails("kselftest pci_bind_test: its output ends early", "kselftest pci_bind_test:")

    def test_kselftest_nonzero_exit(self):
        self.edit("trn2", "output.log", lambda t: t.replace(
            "NU-RC 0\nNU-END kselftest uapi_unbind_test", "NU-RC 1\nNU-END kselftest uapi_unbind_test"))
        self.assertFails("trn2: kselftest uapi_unbind_test: exit status 1")

    def test_kselftest_plan_mismatch(self):
        def edit(t):
            m = block_of(t, "kselftest", "uapi_test")
            body = sub1(r"^ok 2 .*\n", "", m.group(0))
            return t[:m.start()] + body + t[m.end():]
        self.edit("trn1", "output.log", edit)
        self.assertFails("kselftest uapi_test: plan says")


class TestSkips(GateTest):
    def skip_all(self, t):
        return re.sub(r"^((?:    )?ok \d+ [^#\n]+?)$", r"\1 # SKIP not here", t, flags=re.M)

    def test_most_cases_skipped(self):
        self.edit("trn1", "output.log", self.skip_all)
        out = self.assertFails("not allowed to skip on trn1")
        self.assertGreater(len(re.findall("not allowed to skip", out)), 30, out)

    def test_allowed_skip_passes(self):
        t = self.read("trn1", "output.log")
        m = block_of(t, "kselftest", "uapi_test")
        case = re.search(r"^ok 3 (\S+)$", m.group(1), re.M).group(1)
        self.write("trn1", "output.log", t[:m.start()] + sub1(r"^(ok 3 \S+)$", r"\1 # SKIP no 2 MiB",
                                                             m.group(0)) + t[m.end():])
        rc, out = self.gate()
        self.assertEqual(rc, 1, out)
        self.manifest.write_text(self.manifest.read_text() + f'\n[[skip]]\ntest = "kselftest uapi_test"\n'
                                 f'case = "{case}"\nmodels = ["trn1"]\nreason = "test"\n')
        rc, out = self.gate()
        self.assertEqual(rc, 0, out)
        self.assertRegex(out.strip().splitlines()[-1], r", 1 skipped$")
        # Allowed on trn1 only: the same skip on trn2 fails.
        t = self.read("trn2", "output.log")
        m = block_of(t, "kselftest", "uapi_test")
        self.write("trn2", "output.log", t[:m.start()] + sub1(r"^(ok 3 \S+)$", r"\1 # SKIP no", m.group(0))
                   + t[m.end():])
        self.assertFails("not allowed to skip on trn2")


class TestSanitizers(GateTest):
    def console_line(self, model, line):
        self.edit(model, "console.log", lambda t: sub1(r"^(NU-BOUND .*)$", rf"\1\n[   42.000000] {line}", t))

    def test_kmemleak_disabled_itself(self):
        self.console_line("trn1", "kmemleak: Kernel memory leak detector disabled")
        self.assertFails("trn1: a sanitizer disabled itself: kmemleak: Kernel memory leak detector disabled")

    def test_kmemleak_refuses_scan(self):
        self.edit("trn2", "output.log", lambda t: sub1("^NU-KMEMLEAK scans ok ok$", "NU-KMEMLEAK scans failed failed", t))
        self.assertFails("trn2: kmemleak scans failed failed")

    def test_kmemleak_report(self):
        self.edit("trn1", "output.log", lambda t: sub1(
            r"^NU-BEGIN kmemleak report\n",
            "NU-BEGIN kmemleak report\nunreferenced object 0xffff888004b6e5a0 (size 32):\n"
            "  comm \"insmod\", pid 120, jiffies 4294890000\n", t))
        self.assertFails("trn1: kmemleak reports 1 leaked objects", "trn1: kernel splat: unreferenced object")

    def test_dma_api_disabled_itself(self):
        self.console_line("trn1", "DMA-API: debugging out of memory - disabling")
        self.edit("trn1", "output.log", lambda t: sub1("^NU-DMA-API final disabled=N", "NU-DMA-API final disabled=Y", t))
        self.assertFails("trn1: a sanitizer disabled itself", "DMA-API debugging final: disabled=Y")

    def test_dma_api_leak_after_unload(self):
        self.console_line("trn2", "DMA-API: pci 0000:00:03.0: device driver has pending DMA allocations "
                                  "while released from device [count=1]")
        self.edit("trn2", "output.log", lambda t: sub1("^NU-DMA-API after-rmmod disabled=N error_count=0$",
                                                       "NU-DMA-API after-rmmod disabled=N error_count=1", t))
        self.assertFails("trn2: DMA-API debugging after-rmmod: disabled=N error_count=1",
                         "trn2: kernel splat: DMA-API")

    def test_no_sanitizer_evidence(self):
        self.edit("trn1", "output.log", lambda t: re.sub(r"^NU-DMA-API .*\n", "", t, flags=re.M))
        self.assertFails("DMA-API debugging after-rmmod: not reported", "DMA-API debugging final: not reported")

    def test_boot_without_kasan(self):
        self.edit("trn1", "console.log", lambda t: sub1(r"^.*KernelAddressSanitizer initialized.*\n", "", t))
        self.assertFails("trn1: the boot log does not show KASAN initialized")


class TestSplats(GateTest):
    def console_line(self, model, line):
        self.edit(model, "console.log", lambda t: sub1(r"^(NU-BOUND .*)$", rf"\1\n[   42.000000] {line}", t))

    def test_rust_assertion_outside_kunit(self):
        self.console_line("trn1", "    Failure not reported to KUnit since this is a non-KUnit task")
        self.console_line("trn1", "    # neuron_udma_live: ASSERTION FAILED at rust/live_tests.rs:120")
        self.assertFails("trn1: kernel splat: # neuron_udma_live: ASSERTION FAILED at rust/live_tests.rs:120 "
                         "(and 1 more lines")

    def test_detectors(self):
        for line in ("INFO: task kworker/0:1:35 blocked for more than 61 seconds.",
                     "watchdog: BUG: soft lockup - CPU#1 stuck for 33s! [insmod:120]",
                     "rcu: INFO: rcu_sched self-detected stall on CPU",
                     "ODEBUG: free active (active state 0) object: ffff888005d0 object type: timer_list"):
            with self.subTest(line=line):
                self.setUp()
                self.console_line("trn2", line)
                self.assertFails(f"trn2: kernel splat: {line}")

    def console_lines(self, model, lines):
        """Adds `lines` in this order after the NU-BOUND line of `model`'s console."""
        for line in reversed(lines):
            self.console_line(model, line)

    def oom_report(self, comm):
        return [f"{comm} invoked oom-killer: gfp_mask=0x400cc0(GFP_KERNEL_ACCOUNT), order=0, oom_score_adj=0",
                "CPU: 1 UID: 0 PID: 211 Comm: nu_memcg_oom Not tainted 7.3.4 #1",
                "Call Trace:",
                " <TASK>",
                " dump_stack_lvl+0x5d/0x80",
                " </TASK>",
                "memory: usage 9216kB, limit 9216kB, failcnt 61",
                f"Memory cgroup out of memory: Killed process 211 ({comm}) total-vm:1032kB"]

    def test_expected_memcg_oom_is_not_a_splat(self):
        self.console_lines("trn1", self.oom_report("nu_memcg_oom"))
        rc, out = self.gate()
        self.assertEqual(rc, 0, out)

    def test_other_oom_and_later_splats_fail(self):
        self.console_lines("trn1", self.oom_report("insmod"))
        self.assertFails("trn1: kernel splat: Call Trace:")
        self.setUp()
        self.console_lines("trn2", [*self.oom_report("nu_memcg_oom"), "WARNING: CPU: 0 PID: 1 at mm/slub.c:1 x"])
        self.assertFails("trn2: kernel splat: WARNING: CPU: 0 PID: 1 at mm/slub.c:1 x")

    def test_boot_splat_detection(self):
        d = self.tmp / "trn1"
        self.assertFalse(pr.boot_splat(d))
        self.edit("trn1", "console.log", lambda t: "[    0.100000] WARNING: CPU: 0 PID: 0 at early\n" + t)
        self.assertTrue(pr.boot_splat(d))

    def test_boot_splat_after_a_command_line_naming_the_module(self):
        # The multi-device pass boots with kunit.filter_glob=neuron_udma_...: still a boot splat.
        d = self.tmp / "trn1-multi"
        shutil.copytree(FIXTURES / "trn1-multi", d)
        self.assertFalse(pr.boot_splat(d))
        self.edit("trn1-multi", "console.log", lambda t: sub1(
            r"^(.*KernelAddressSanitizer initialized.*\n)",
            r"\1[    0.006368] BUG: KASAN: wild-memory-access in do_raw_spin_lock+0xb6/0x1f0\n", t))
        self.assertTrue(pr.boot_splat(d))


class TestDmatest(unittest.TestCase):
    """dmatest's summary lines, phase by phase (tests/kselftest/dmatest_test.c)."""

    @staticmethod
    def log(name, summaries, expect="clean", results=0, end=True, channels=2, min_tests=1000):
        lines = [f"neuron_udma-dmatest: phase {name} channels {channels} min {min_tests} expect {expect}"]
        for ch, tests, fails in summaries:
            for t in range(2):
                lines.append(f"dmatest: {ch}-copy{t}: summary {tests} tests, {fails} failures 10.00 iops 40 KB/s (0)")
        lines += [f"dmatest: dma0chan0-copy0: result #{i + 1}: 'data error' with src_off=0x0" for i in range(results)]
        if end:
            lines.append(f"neuron_udma-dmatest: phase {name} end")
        return lines

    def all_clean(self, **over):
        lines = []
        for name in pr.DMATEST_PHASES:
            kw = dict(expect="failures" if name == "fault" else "any" if name == "unbind" else "clean")
            fails = 1 if name == "fault" else 0
            kw.update(over.get(name, {}))
            summ = kw.pop("summaries", [("dma0chan0", 500, fails), ("dma0chan1", 500, 0)])
            lines += self.log(name, summ, **kw)
        return lines

    def test_clean_run_passes(self):
        phases = pr.dmatest_phases(self.all_clean())
        self.assertEqual([], pr.dmatest_problems(phases))
        self.assertEqual({"dma0chan0": 1000, "dma0chan1": 1000}, phases[0]["tests"])

    def test_a_failure_fails(self):
        bad = self.all_clean(random={"summaries": [("dma0chan0", 500, 1), ("dma0chan1", 500, 0)]})
        self.assertIn("dmatest phase random: 2 failures, 0 result lines", pr.dmatest_problems(pr.dmatest_phases(bad)))

    def test_a_result_line_fails(self):
        bad = self.all_clean(polled={"results": 1})
        self.assertIn("dmatest phase polled: 0 failures, 1 result lines", pr.dmatest_problems(pr.dmatest_phases(bad)))

    def test_fewer_tests_or_channels_fail(self):
        few = self.all_clean(random={"summaries": [("dma0chan0", 400, 0), ("dma0chan1", 500, 0)]})
        self.assertIn("dmatest phase random: dma0chan0 ran 800 tests, fewer than 1000",
                      pr.dmatest_problems(pr.dmatest_phases(few)))
        one = self.all_clean(align={"summaries": [("dma0chan0", 500, 0)]})
        self.assertIn("dmatest phase align: summaries of 1 channels, 2 expected",
                      pr.dmatest_problems(pr.dmatest_phases(one)))

    def test_fault_without_failures_and_missing_phase_fail(self):
        bad = self.all_clean(fault={"summaries": [("dma0chan0", 500, 0), ("dma0chan1", 500, 0)]})
        self.assertIn("dmatest phase fault: the injected fault failed no test", pr.dmatest_problems(pr.dmatest_phases(bad)))
        lines = [ln for ln in self.all_clean() if "phase size65537" not in ln]
        self.assertIn("dmatest phase size65537 did not run", pr.dmatest_problems(pr.dmatest_phases(lines)))

    def test_unfinished_phase_fails(self):
        bad = self.all_clean(unbind={"end": False})
        self.assertIn("dmatest phase unbind: no end marker (the run hung or crashed?)",
                      pr.dmatest_problems(pr.dmatest_phases(bad)))


class TestRunIdentity(GateTest):
    def test_trn2_directory_holds_a_trn1_run(self):
        self.assertFails("trn2: the bound device is 1d0f:7164, the trn2 model is 1d0f:7364",
                         runs=[f"trn1={self.tmp / 'trn1'}", f"trn2={self.tmp / 'trn1'}"])

    def test_no_device_id(self):
        self.edit("trn1", "console.log", lambda t: sub1(r"^(NU-BOUND \S+) \S+$", r"\1", t))
        self.assertFails("trn1: the bound device is not printed")

    def test_root_dir_not_world_readable(self):
        # The initramfs staged in a mktemp -d directory made the guest's / 0700.
        self.edit("trn1", "output.log", lambda t: sub1(r"^NU-IMAGE root=755 (.*) udma1=1001 ok",
                                                       r"NU-IMAGE root=700 \1 udma1=sh: can't open", t))
        self.assertFails("trn1: the guest image for unprivileged users: root=700")

    def test_detector_settings(self):
        self.edit("trn1", "output.log", lambda t: sub1("hung_task_timeout_secs=60", "hung_task_timeout_secs=120", t))
        self.assertFails("trn1: hung-task/soft-lockup detector settings")

    def test_no_reload_cycle(self):
        self.edit("trn2", "output.log", lambda t: sub1(r"^NU-RELOAD ok.*$", "NU-RELOAD failed: rmmod", t))
        self.assertFails("trn2: the second load/unload cycle: failed: rmmod")

    def test_plan_incomplete(self):
        self.edit("trn1", "output.log", lambda t: t[:t.index("NU-RMMOD")])
        self.assertFails("trn1: the driver did not unload", "trn1: the test plan did not complete")


class TestHostStages(GateTest):
    def test_lint_counts(self):
        log = self.tmp / "lint.log"
        log.write_text("NU-LINT ok scripts/check\nscripts/vm-run:3:1: warning: x [SC2034]\nNU-LINT failed scripts/vm-run\n")
        rc, out = self.gate(runs=[f"trn1={self.tmp / 'trn1'}"], extra=["--lint", str(log)])
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: shellcheck scripts/vm-run: 1 findings, first: scripts/vm-run:3:1", out)
        log.write_text("")
        rc, out = self.gate(runs=[f"trn1={self.tmp / 'trn1'}"], extra=["--lint", str(log)])
        self.assertIn("FAILED: shellcheck did not run", out)

    def test_unittest_counts(self):
        log = self.tmp / "ut.log"
        log.write_text("FAIL: test_x (m.T.test_x)\n----\nRan 5 tests in 0.1s\n\nFAILED (failures=1)\n")
        rc, out = self.gate(runs=[f"trn1={self.tmp / 'trn1'}"], extra=["--unittest", str(log)])
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: parser unit test test_x", out)


# The fixture manifest plus the multi-device pass, as tests/expected.toml has it.
MULTI_PASS = """
[passes.multi]
devices = 4

[kselftest.multi_device_test]
pass = "multi"
min_cases = 4

[kselftest.unbind_load_test]
pass = "multi"
min_cases = 3
"""


class TestPasses(GateTest):
    """An extra pass ([passes] of the manifest): tests/fixtures/trn1-multi is the multi-device pass
    (4 devices) of a real trn1 run of 2026-11-30, its console trimmed to the lines the gate reads."""

    def setUp(self):
        super().setUp()
        shutil.copytree(FIXTURES / "trn1-multi", self.tmp / "trn1-multi")
        self.manifest.write_text(self.manifest.read_text() + MULTI_PASS)
        self.runs = [f"trn1={self.tmp / 'trn1'}", f"trn1:multi={self.tmp / 'trn1-multi'}"]

    def test_both_passes_pass(self):
        rc, out = self.gate(self.runs)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"(?m)^trn1:multi: 0 KUnit suites \(0 cases\), 2 kselftests \(\d+ cases\)")

    def test_missing_pass(self):
        self.assertFails("trn1:multi: the multi pass did not run", runs=self.runs[:1])

    def test_pass_that_did_not_boot(self):
        shutil.rmtree(self.tmp / "trn1-multi")
        self.assertFails("trn1:multi: the VM did not boot", runs=self.runs)

    def test_three_devices(self):
        self.edit("trn1-multi", "output.log", lambda t: sub1(r"^NU-DEVICE .*\n", "", t))
        self.assertFails("3 Neuron devices in the guest", runs=self.runs)

    def test_unbound_device(self):
        self.edit("trn1-multi", "output.log",
                  lambda t: sub1(r"^(NU-DEVICE \S+ \S+) neuron_udma$", r"\1 none", t))
        self.assertFails("or not bound to neuron_udma", runs=self.runs)

    def test_another_models_device(self):
        self.edit("trn1-multi", "output.log",
                  lambda t: sub1(r"^(NU-DEVICE \S+) 1d0f:7164", r"\1 1d0f:7364", t))
        self.assertFails("not the trn1 model's", runs=self.runs)

    def test_unbind_test_did_not_run(self):
        self.edit("trn1-multi", "output.log", lambda t: drop_block(t, "kselftest", "unbind_load_test"))
        self.assertFails("trn1:multi: kselftest unbind_load_test: did not run", runs=self.runs)

    def test_multi_test_in_the_main_pass(self):
        multi = block_of(self.read("trn1-multi", "output.log"), "kselftest", "multi_device_test").group(0)
        self.edit("trn1", "output.log", lambda t: sub1(r"^NU-RMMOD", multi + "NU-RMMOD", t))
        self.assertFails("trn1: kselftest multi_device_test: ran in the main pass", runs=self.runs)

    def test_splat_in_the_pass(self):
        self.edit("trn1-multi", "console.log",
                  lambda t: t + "[   40.1] INFO: task unbind_load_te:123 blocked for more than 60 seconds.\n")
        self.assertFails("trn1:multi: kernel splat: INFO: task", runs=self.runs)

    def test_dma_api_leak_in_the_pass(self):
        self.edit("trn1-multi", "output.log", lambda t: sub1(
            r"^NU-DMA-API final disabled=N error_count=0", "NU-DMA-API final disabled=N error_count=2", t))
        self.assertFails("trn1:multi: DMA-API debugging final", runs=self.runs)

    def test_kmemleak_in_the_pass(self):
        self.edit("trn1-multi", "output.log", lambda t: sub1(
            r"^NU-BEGIN kmemleak report\n",
            "NU-BEGIN kmemleak report\nunreferenced object 0xffff888004f1c000 (size 64):\n", t))
        self.assertFails("trn1:multi: kmemleak reports 1 leaked objects", runs=self.runs)

    def test_kunit_in_the_pass(self):
        ktap = "".join(f"[   20.0] {ln}\n" for ln in (
            "    # Subtest: neuron_udma_ring", "    1..1", "    ok 1 x", "ok 1 neuron_udma_ring"))
        self.edit("trn1-multi", "console.log", lambda t: t + ktap)
        self.assertFails("trn1:multi: kunit neuron_udma_ring: ran in the multi pass", runs=self.runs)


DKMS_STEPS = """
[dkms]
steps = ["add", "build", "copy"]
"""


EXAMPLES = """
[example.fence_copy_c]
command = "fence_copy_c"
expect = "fence_copy: OK:"

[example.multi_queue_rs]
command = "multi_queue_rs"
"""


def example_block(name, body, rc=0, end=True):
    out = f"NU-BEGIN example {name}\n{body}NU-RC {rc}\nNU-SECONDS 2\n"
    return out + (f"NU-END example {name}\n" if end else "")


class TestExamples(GateTest):
    """[example.NAME] of the manifest: programs run by the main pass, one case each, passed when
    they exit 0 and print their `expect` line."""

    def setUp(self):
        super().setUp()
        self.manifest.write_text(self.manifest.read_text() + EXAMPLES)
        self.fence_ok = "device /dev/neuron_udma0: ABI 3\nfence_copy: OK: 1024 KiB host -> HBM -> host\n"

    def add(self, model, *blocks):
        self.edit(model, "output.log", lambda t: sub1(r"^NU-RMMOD", "".join(blocks) + "NU-RMMOD", t))

    def both_pass(self):
        for m in ("trn1", "trn2"):
            self.add(m, example_block("fence_copy_c", self.fence_ok), example_block("multi_queue_rs", "done\n"))

    def test_examples_pass_and_count(self):
        rc0, before = self.gate()
        self.both_pass()
        rc, out = self.gate()
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"(?m)^trn1: \d+ KUnit suites \(\d+ cases\), \d+ kselftests \(\d+ cases\), 2 examples, boots")
        passed = lambda text: int(re.search(r"^(\d+) passed", text.splitlines()[-1]).group(1))
        self.assertEqual(rc0, 1, before)  # the fixtures have no examples: missing
        self.assertIn("example fence_copy_c: did not run", before)
        self.assertEqual(passed(out), passed(before) + 4 + 2)  # 4 examples, 2 "none missing"

    def test_nonzero_exit_fails_with_the_last_line(self):
        self.both_pass()
        self.edit("trn2", "output.log", lambda t: sub1(
            r"^fence_copy: OK: .*\nNU-RC 0", "fence_copy: FAILED: FENCE_STATUS: EIO\nNU-RC 1", t))
        self.assertFails("trn2: example fence_copy_c: exit status 1; no line with 'fence_copy: OK:' in its "
                         "output; its last line: fence_copy: FAILED: FENCE_STATUS: EIO")

    def test_missing_expect_line_fails(self):
        self.both_pass()
        self.edit("trn1", "output.log", lambda t: sub1(r"^fence_copy: OK: .*\n", "", t))
        self.assertFails("trn1: example fence_copy_c: no line with 'fence_copy: OK:'")

    def test_lost_end_marker_fails(self):
        for m in ("trn1", "trn2"):
            self.add(m, example_block("multi_queue_rs", "done\n"),
                     example_block("fence_copy_c", "device /dev/neuron_udma0\n", rc=0, end=False))
        self.assertFails("example fence_copy_c: its output ends early")

    def test_missing_and_unnamed_examples_fail(self):
        for m in ("trn1", "trn2"):
            self.add(m, example_block("fence_copy_c", self.fence_ok), example_block("stray_rs", "x\n"))
        self.assertFails("trn1: example multi_queue_rs: did not run",
                         "trn1: example stray_rs: ran but not named in tests/expected.toml")

    def test_list_examples(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            pr.run(["--manifest", str(self.manifest), "--list", "examples", "--pass", "main"])
        self.assertEqual(out.getvalue().splitlines(), ["fence_copy_c fence_copy_c", "multi_queue_rs multi_queue_rs"])

    def test_example_needs_a_command(self):
        self.manifest.write_text(self.manifest.read_text() + "\n[example.bare]\nexpect = \"x\"\n")
        with self.assertRaisesRegex(ValueError, "example.bare: needs command"):
            pr.Manifest(self.manifest)


class TestDkms(GateTest):
    """The DKMS stage (--dkms LOG: scripts/dkms-check's output and scripts/check's NU-DKMS-EXIT and
    NU-DKMS-SECONDS lines), on top of a passing run (the trn1 main and multi passes)."""

    def setUp(self):
        super().setUp()
        shutil.copytree(FIXTURES / "trn1-multi", self.tmp / "trn1-multi")
        self.manifest.write_text(self.manifest.read_text() + MULTI_PASS + DKMS_STEPS)
        self.runs = [f"trn1={self.tmp / 'trn1'}", f"trn1:multi={self.tmp / 'trn1-multi'}"]
        self.log = self.tmp / "dkms.log"
        self.ok_log = ("NU-DKMS ok add neuron-udma/0.1.0\nBuilding module(s)... done.\n"
                       "NU-DKMS ok build neuron-udma/0.1.0 for 7.3.4\n"
                       "NU-DKMS ok copy 64 MiB host -> HBM -> host\n")

    def dkms_gate(self, text, extra=None):
        self.log.write_text(text)
        return self.gate(self.runs, extra=["--dkms", str(self.log)] if extra is None else extra)

    def test_every_step_passes(self):
        rc, out = self.dkms_gate(self.ok_log + "NU-DKMS-EXIT 0\nNU-DKMS-SECONDS 95\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("dkms: 3/3 steps in 95 s", out)

    def test_missing_step_fails_with_the_error(self):
        text = self.ok_log.replace("NU-DKMS ok copy", "copy failed:") + \
            "[23:01:29] error: scripts/vm-run, line 9: 'x' failed\nNU-DKMS-EXIT 1\n"
        rc, out = self.dkms_gate(text)
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: dkms copy: did not pass (build/check/dkms.log): [23:01:29] error: "
                      "scripts/vm-run", out)
        self.assertIn("FAILED: dkms: scripts/dkms-check exited 1", out)
        self.assertIn("dkms: 2/3 steps", out)

    def test_nonzero_exit_fails_although_every_step_printed(self):
        rc, out = self.dkms_gate(self.ok_log + "NU-DKMS-EXIT 2\n")
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: dkms: scripts/dkms-check exited 2", out)

    def test_no_exit_line_fails(self):
        rc, out = self.dkms_gate(self.ok_log)
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: dkms: scripts/dkms-check exited (no NU-DKMS-EXIT line)", out)

    def test_stage_not_run(self):
        rc, out = self.dkms_gate(self.ok_log, extra=[])
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: dkms: the DKMS stage did not run (tests/expected.toml [dkms]", out)
        rc, out = self.gate(self.runs, extra=["--dkms", str(self.tmp / "no-such.log")])
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: dkms: the DKMS stage did not run (no build/check/dkms.log)", out)

    def test_manifest_needs_steps(self):
        self.manifest.write_text(self.manifest.read_text().replace(
            'steps = ["add", "build", "copy"]', "steps = []"))
        with self.assertRaisesRegex(ValueError, r"\[dkms\]: needs steps"):
            pr.Manifest(self.manifest)

    def test_splats(self):
        d = self.tmp / "vm"
        d.mkdir()
        (d / "console.log").write_text("[    1.0] neuron_udma 0000:00:03.0: bound\n")
        (d / "output.log").write_text("copied /tmp/data.bin: 67108864 bytes, verified\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(pr.run(["--splats", str(d)]), 0)
        (d / "console.log").write_text("[    2.0] BUG: KASAN: use-after-free in foo\n")
        with contextlib.redirect_stdout(out):
            self.assertEqual(pr.run(["--splats", str(d)]), 1)
        self.assertIn("splat: BUG: KASAN: use-after-free in foo", out.getvalue())
        (d / "console.log").unlink()
        with contextlib.redirect_stdout(out):
            self.assertEqual(pr.run(["--splats", str(d)]), 1)


class TestManifest(unittest.TestCase):
    """tests/expected.toml names exactly the suites and kselftests of the tree."""

    def setUp(self):
        self.m = pr.Manifest(pr.MANIFEST)

    def test_kunit_suites_match_the_sources(self):
        suites = set()
        # The module's sources and the bench code make bench compiles into it.
        for f in [*(TOP / "rust").rglob("*.rs"), *(TOP / "tests" / "bench" / "kernel").glob("*.rs")]:
            suites |= set(re.findall(r"#\[(?:kernel::prelude::)?kunit_tests\((\w+)\)\]", f.read_text()))
        self.assertTrue(suites)
        self.assertEqual(suites, set(self.m.kunit), "#[kunit_tests] of rust/ and tests/bench/kernel/ and tests/expected.toml differ")

    def test_every_kselftest_source_is_named(self):
        sources = {f.stem for f in (TOP / "tests" / "kselftest").glob("*.c")}
        self.assertTrue(sources)
        self.assertEqual(sources - set(self.m.kselftest), set(), "kselftests missing from tests/expected.toml")

    def test_every_example_is_named(self):
        # examples/NAME.c runs as NAME_c, tools/neuron-udma/examples/NAME.rs as NAME_rs, in the main pass.
        sources = {f"{f.stem}_c" for f in (TOP / "examples").glob("*.c")}
        sources |= {f"{f.stem}_rs" for f in (TOP / "tools" / "neuron-udma" / "examples").glob("*.rs")}
        self.assertIn("fence_copy_c", sources)
        self.assertEqual(sources, set(self.m.example), "examples/ and tools/neuron-udma/examples/ against "
                                                       "tests/expected.toml [example.*]")
        for n in sources:
            self.assertEqual(self.m.pass_of(n, "example"), "main")
            self.assertEqual(self.m.example[n]["command"].split()[0], n)

    def test_every_model_has_an_id(self):
        self.assertEqual(self.m.models, {"trn1": "1d0f:7164", "trn2": "1d0f:7364"})

    def test_passes(self):
        self.assertEqual({n: e["devices"] for n, e in self.m.passes.items()}, {"multi": 4, "numa": 1})
        self.assertEqual({n for n, e in self.m.passes.items() if e.get("numa")}, {"numa"})
        self.assertEqual({n for n, e in self.m.passes.items() if e.get("switch")}, {"multi"})
        self.assertEqual(set(self.m.required("kselftest", "numa")), {"numa_test"})
        self.assertEqual(set(self.m.required("kselftest", "multi")), {"multi_device_test", "unbind_load_test", "unbind_events_test",
                                                                  "cross_device_test",
                                                                  "udma_fuzz_unbind"})
        self.assertIn("udma_fuzz_unbind udma-fuzz --unbind --ops 2000 --uring on", self.m.commands("multi"))
        self.assertNotIn("udma_fuzz_unbind", self.m.required("kselftest", "main"))
        self.assertEqual(self.m.required("kunit", "multi"), [])
        self.assertNotIn("unbind_load_test", self.m.required("kselftest", "main"))

    def test_dkms_steps_are_the_scripts(self):
        # Every step the gate requires is one scripts/dkms-check prints, and the other way round.
        printed = set(re.findall(r"NU-DKMS ok ([a-z]+)", (TOP / "scripts" / "dkms-check").read_text()))
        self.assertEqual(set(self.m.dkms["steps"]), printed)

    def test_fixture_manifest_is_the_real_one_of_its_time(self):
        # The fixture's manifest differs from the real one only by what was added since.
        fix = pr.Manifest(FIXTURE_MANIFEST)
        self.assertLessEqual(set(fix.kunit), set(self.m.kunit))
        self.assertLessEqual(set(fix.kselftest), set(self.m.kselftest))


# The source layout rules and the documentation's rule run with these tests (make check, stage 2).
from test_docs import Docs  # noqa: E402,F401
from test_layout import CallChains, KernelFragments, Layout, Sizes, Submission  # noqa: E402,F401

if __name__ == "__main__":
    unittest.main(verbosity=2)
