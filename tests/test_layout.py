#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The module's layout rules (Documentation/neuron-udma.rst, "Components"), checked on the
source: no two files of rust/ import each other (no module cycle at all), generations differ only
in arch.rs, register sequences have no unreachable error paths, ring arithmetic stays in ring.rs,
every "hardware.rst §N.M" reference resolves to a section of Documentation/hardware.rst, the pair
limit is known in one splitter and pairs are written by one submission engine, no source file
is over 900 lines, and the C/Rust interface is rust/kfac/'s (its headers agree with both sides,
bindgen writes every Rust declaration of a C function, every function C calls is `unsafe extern
"C"` with a `# Safety` section, no C file of rust/ is over 450 lines), and the call chains of
neuron-udma.rst ("Call chains") agree with themselves and the code: stops numbered in order, a
return marked (R) exactly where its file was visited before, the header's counts those of its
list, every file and every function a stop names there."""

import pathlib
import re
import unittest

TOP = pathlib.Path(__file__).resolve().parent.parent
RUST = TOP / "rust"
# A module's children live in rust/<module>/ (e.g. rust/device/queues.rs): they count as that module.
# Not the files Kbuild generates with bindgen (rust/uapi_generated.rs, rust/kfac/*_generated.rs).
SOURCES = [p for p in sorted(RUST.glob("*.rs")) + sorted(RUST.glob("*/*.rs")) if not p.stem.endswith("_generated")]


def module_of(path):
    """The crate module a source file belongs to: its stem, or its directory's for a child."""
    return path.stem if path.parent == RUST else path.parent.name


def code(path):
    """The file's text without comments (line comments, doc comments)."""
    return re.sub(r"//.*", "", path.read_text())


def modules():
    return {module_of(p) for p in SOURCES if p.stem != "uapi_generated"}


def imports(path, mods):
    """The crate modules `path` uses: `crate::m` anywhere, and `m::` inside `use crate::{...}`."""
    text = code(path)
    used = set(re.findall(r"\bcrate::(\w+)", text))
    for block in re.findall(r"use crate::\{(.*?)\};", text, re.S):
        # Only the first path segment of each item at depth 0 of the braces.
        depth, item = 0, ""
        for ch in block + ",":
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                first = re.match(r"\s*(\w+)", item)
                if first:
                    used.add(first.group(1))
                item = ""
            else:
                item += ch
    return {m for m in used if m in mods and m != module_of(path)}


class Layout(unittest.TestCase):
    def test_no_module_cycles(self):
        mods = modules()
        graph = {}
        for p in SOURCES:
            if module_of(p) in mods:
                graph.setdefault(module_of(p), set()).update(imports(p, mods))
        # The KUnit-only test modules may use anything; nothing uses them but the crate root.
        for m, deps in graph.items():
            for d in deps:
                self.assertNotIn(m, graph.get(d, set()), f"rust/{m}.rs and rust/{d}.rs import each other")
        state = {}

        def visit(m, path):
            state[m] = "active"
            for d in sorted(graph.get(m, ())):
                if state.get(d) == "active":
                    self.fail("module cycle: " + " -> ".join(path + [m, d]))
                if d not in state:
                    visit(d, path + [m])
            state[m] = "done"

        for m in sorted(graph):
            if m not in state:
                visit(m, [])

    def test_generations_differ_only_in_arch(self):
        for p in SOURCES:
            if p.name in ("arch.rs", "uapi_generated.rs"):
                continue
            for n, line in enumerate(code(p).splitlines(), 1):
                self.assertIsNone(re.search(r"Generation::|0x1d0f", line, re.I), f"{p.name}:{n}: {line.strip()}")

    def test_engine_sequences_have_no_unreachable_errors(self):
        self.assertEqual(code(RUST / "engine.rs").count("ok_or(EINVAL)"), 0)

    def test_ring_arithmetic_only_in_ring(self):
        for p in SOURCES:
            if p.name == "ring.rs":
                continue
            text = code(p)
            self.assertIsNone(re.search(r"&\s*\(\s*\w+\s*-\s*1\s*\)", text), f"{p.name}: ring index masking outside ring.rs")

    def test_file_does_no_queue_policy(self):
        """file.rs and its children (rust/file/) decode and validate the ABI and keep per-file ids;
        every operation on a queue is a Channel method (no queue closure, none of the lower layers
        imported)."""
        for p in [RUST / "file.rs"] + sorted((RUST / "file").glob("*.rs")):
            name = p.relative_to(RUST)
            self.assertEqual(len(re.findall(r"\.with\(", code(p))), 0, f"rust/{name} runs a closure on a queue")
            lower = imports(p, modules()) & {"engine", "regs", "ring", "desc", "queue"}
            self.assertEqual(lower, set(), f"rust/{name} imports {sorted(lower)}")

    def test_kfac_interface_agrees(self):
        """Every function that crosses between C and Rust is declared in a header of rust/kfac/:
        those C defines outside `#ifndef __BINDGEN__` (bindgen generates their Rust declarations,
        the module of the same name wraps them), those Rust defines (#[no_mangle]) inside it (C
        only). The C files define no other non-static function but those of an *_internal.h."""
        kfac = RUST / "kfac"
        kbuild = (TOP / "Kbuild").read_text()
        generated = set(re.search(r"^neuron_udma_kfac_h := (.*)$", kbuild, re.M).group(1).split())
        for_rust, from_rust, internal = {}, set(), set()
        for h in sorted(kfac.glob("*.h")):
            text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
            if h.stem.endswith("_internal"):
                internal |= set(re.findall(r"\b(neuron_udma_\w+)\s*\(", text))
                continue
            self.assertIn(h.stem, generated, f"Kbuild does not run bindgen on {h.relative_to(TOP)}")
            rust_part = "".join(re.findall(r"#ifndef __BINDGEN__\n(.*?)#endif", text, re.S))
            c_part = re.sub(r"#ifndef __BINDGEN__\n.*?#endif", "", text, flags=re.S)
            for name in re.findall(r"\b(neuron_udma_\w+)\s*\(", c_part):
                for_rust[name] = h.stem
            from_rust |= set(re.findall(r"\b(neuron_udma_\w+)\s*\(", rust_part))
        self.assertEqual(generated, {h.stem for h in kfac.glob("*.h") if not h.stem.endswith("_internal")})
        for stem in generated:
            wrapper = (kfac / f"{stem}.rs").read_text()
            self.assertIn(f'include!("{stem}_generated.rs")', wrapper, f"rust/kfac/{stem}.rs")
            for name, h in for_rust.items():
                if h == stem:
                    self.assertRegex(wrapper, rf"\b{name}\b", f"rust/kfac/{stem}.rs does not use {name}")
        c_defs = set()
        for c in sorted(kfac.glob("*.c")):
            text = re.sub(r"/\*.*?\*/", "", c.read_text(), flags=re.S)
            c_defs |= set(re.findall(r"^(?!static)[a-z_][\w ]*?\**\b(neuron_udma_\w+)\(", text, re.M))
        self.assertEqual(set(for_rust) - c_defs, set(), "declared for Rust, defined by no C file")
        self.assertEqual(c_defs - set(for_rust) - internal, set(), "C functions missing from the headers")
        rust_defs = set()
        for p in SOURCES:
            rust_defs |= set(re.findall(r"#\[no_mangle\]\s*(?:pub\((?:crate|super)\)\s+)?(?:unsafe\s+)?extern \"C\" fn (neuron_udma_\w+)",
                                        p.read_text()))
        self.assertEqual(rust_defs, from_rust, "the #[no_mangle] functions of rust/ and the headers' Rust sections differ")

    def test_no_handwritten_ffi_declarations(self):
        """The Rust declarations of C functions are bindgen's (Kbuild): no extern block in rust/."""
        for p in SOURCES:
            self.assertIsNone(re.search(r'\bextern\s+(?:"C"\s*)?\{', code(p)), f"{p.relative_to(TOP)}: an extern block")

    def test_c_callbacks_are_unsafe(self):
        """Every function C calls is `unsafe extern "C"` (it takes C's pointers on trust) and its
        documentation says what the caller guarantees (`# Safety`)."""
        found = 0
        for p in SOURCES:
            lines = p.read_text().splitlines()
            for n, line in enumerate(lines):
                if not re.search(r'\bextern "C" fn\b', line) or line.lstrip().startswith("//"):
                    continue
                found += 1
                where = f"{p.relative_to(TOP)}:{n + 1}"
                self.assertRegex(line, r'\bunsafe extern "C" fn\b', f"{where}: a safe extern \"C\" fn")
                doc = []
                for prev in reversed(lines[:n]):
                    if prev.lstrip().startswith(("///", "#[")):
                        doc.append(prev)
                    else:
                        break
                self.assertIn("/// # Safety", "\n".join(doc), f"{where}: no # Safety section")
        self.assertGreaterEqual(found, 20)

    def test_c_files_are_small(self):
        """The C of rust/ holds only what Rust cannot call: no file of it is over 450 lines."""
        for c in sorted(RUST.rglob("*.c")):
            n = len(c.read_text().splitlines())
            self.assertLessEqual(n, 450, f"{c.relative_to(TOP)} has {n} lines")

    def test_hardware_references_resolve(self):
        labels = set(re.findall(r"^\.\. _hw-([\w.]+):", (TOP / "Documentation" / "hardware.rst").read_text(), re.M))
        self.assertTrue(labels)
        files = SOURCES + sorted((TOP / "Documentation").glob("*.rst")) + [TOP / "README.md"]
        refs = 0
        for p in files:
            for ref in re.findall(r"hardware\.rst §([0-9]+(?:\.[0-9]+)*|[A-Z](?![\w.]))", p.read_text()):
                refs += 1
                self.assertIn(ref, labels, f"{p.relative_to(TOP)}: hardware.rst §{ref} has no section")
            self.assertNotRegex(p.read_text(), r"\bspec [0-9]+\.[0-9]+", f"{p.relative_to(TOP)}: a 'spec N.M' reference")
        self.assertGreater(refs, 50)


# Files compiled only into KUnit builds: their code is test code, not the driver's.
# KUnit-only sources: these files and the children of live_tests.rs (rust/live_tests/).
KUNIT_ONLY = {"live_tests.rs", "testing.rs"}
# Longest production source file of rust/, in lines (Documentation/neuron-udma.rst, "Components").
MAX_LINES = 900
# Files allowed over MAX_LINES: none (file.rs and shim.rs were split, issue 34); nothing may be
# added.
OVER_MAX_LINES = set()


def production(path):
    """The file's code without comments and without its KUnit test module (the
    `#[kunit_tests(...)]` module, always last in a file)."""
    text = code(path)
    tests = re.search(r"^#\[cfg\(neuron_udma_kunit\)\]\s*#\[(?:kernel::prelude::)?kunit_tests\(", text, re.M)
    return text[: tests.start()] if tests else text


def driver_sources():
    return [
        p
        for p in SOURCES
        if p.name not in KUNIT_ONLY and p.parent.name != "live_tests" and p.stem != "uapi_generated"
    ]


class Submission(unittest.TestCase):
    """One splitter and one submission engine (issue 34): the pair limit and the barriers of a
    submission are known in split.rs alone, and every data pair is written by submit.rs."""

    def users(self, pattern):
        """The modules whose production code matches `pattern`."""
        return {module_of(p) for p in driver_sources() if re.search(pattern, production(p))}

    def test_pair_limit_known_in_one_module(self):
        """The pair limit (desc.rs's MAX_DESC_BYTES, the encoding of length 0) is used by exactly
        one module besides the descriptor encoding: the splitter; and only the splitter cuts a
        copy into pieces (span.rs's Pieces)."""
        self.assertEqual(self.users(r"\bMAX_DESC_BYTES\b") - {"desc"}, {"split"})
        self.assertEqual(self.users(r"\bPieces::new\("), {"split"})

    def test_only_the_engine_writes_pairs(self):
        """A ring slot is written only by the descriptor encoding of queue.rs (its write_pair,
        for data pairs and the fence's marker pair), and a data pair only through the writers
        of the submission engine (submit.rs)."""
        self.assertEqual(self.users(r"\.push\(\|"), {"queue"})
        self.assertEqual(self.users(r"\bwrite_pair\("), {"queue"})
        writers = self.users(r"\.(?:prepare_one|write_submission|write_fenced)\(") - {"queue"}
        self.assertEqual(writers, {"submit"})

    def test_one_submission_loop(self):
        """The splitter hands out a driver submission's pairs (split::submission) to the engine
        alone, and the engine waits only with the driver's one back-off (its private Backoff):
        no sleep outside Backoff::pause."""
        self.assertEqual(self.users(r"\bsplit::submission\("), {"submit"})
        text = production(RUST / "submit.rs")
        pause = re.search(r"\n    fn pause\(&mut self\) \{\n.*?\n    \}\n", text, re.S)
        self.assertIsNotNone(pause, "submit.rs: Backoff::pause")
        self.assertIn("fsleep", pause.group(0))
        rest = text.replace(pause.group(0), "")
        self.assertIsNone(re.search(r"\b(?:fsleep|msleep|usleep_range|cpu_relax)\(", rest))
        self.assertEqual(self.users(r"\bBackoff\b"), {"submit"})


class Sizes(unittest.TestCase):
    def test_no_source_file_over_the_limit(self):
        over = {p.name for p in driver_sources() if len(p.read_text().splitlines()) > MAX_LINES}
        self.assertEqual(over - OVER_MAX_LINES, set(), f"rust/ files over {MAX_LINES} lines")
        for name in OVER_MAX_LINES:
            self.assertTrue((RUST / name).exists(), f"rust/{name} is gone: drop it from OVER_MAX_LINES")


# Documentation/neuron-udma.rst, "Call chains": `N. ``file`` what`, a stop a line.
CHAIN_HEADER = re.compile(r"^(.*?): (\d+) stops, (\d+) returns")
CHAIN_ITEM = re.compile(r"^(\d+)\.\s+``([^`]+)``\s+(.*)$")


def call_chains():
    """The chains of neuron-udma.rst: {title: (stops, returns, [(number, file, text)])}."""
    lines = (TOP / "Documentation" / "neuron-udma.rst").read_text().splitlines()
    chains, cur = {}, None
    for i, line in enumerate(lines):
        m = CHAIN_HEADER.match(line)
        if m:
            cur = chains.setdefault(m.group(1), (int(m.group(2)), int(m.group(3)), []))
            continue
        m = CHAIN_ITEM.match(line)
        if m and cur is not None:
            text = m.group(3)
            j = i + 1
            while j < len(lines) and lines[j].startswith("   ") and lines[j].strip():
                text += " " + lines[j].strip()
                j += 1
            cur[2].append((int(m.group(1)), m.group(2), text))
    return chains


class CallChains(unittest.TestCase):
    def test_counts_and_returns_agree(self):
        chains = call_chains()
        self.assertGreaterEqual(len(chains), 6)
        for title, (stops, returns, items) in chains.items():
            self.assertEqual([n for n, _, _ in items], list(range(1, len(items) + 1)), title)
            seen, r = set(), 0
            for n, f, text in items:
                marked = text.endswith("(R)")
                self.assertEqual(marked, f in seen, f"{title}, stop {n} ({f}): (R) iff the file was visited before")
                r += marked
                seen.add(f)
            self.assertEqual((stops, returns), (len(items), r), f"{title}: the header's counts")

    def test_named_functions_exist(self):
        missing = []
        for title, (_, _, items) in call_chains().items():
            for n, f, text in items:
                path = RUST / f
                self.assertTrue(path.exists(), f"{title}, stop {n}: rust/{f}")
                src = path.read_text()
                # The functions the stop names before its colon (``a`` → ``b``, ``T::m``; what
                # stands in parentheses is said of another file).
                head = re.sub(r"\([^)]*\)", "", text.split(": ")[0])
                for name in re.findall(r"``([A-Za-z_][\w:]*)``", head):
                    fn = name.split("::")[-1]
                    pat = rf"\bfn {fn}\b" if f.endswith(".rs") else rf"\b{fn}\("
                    missing.extend([f"{title}, stop {n}: {name} in rust/{f}"] if not re.search(pat, src) else [])
        self.assertEqual(missing, [], "functions the call chains name that their files lack")


class KernelFragments(unittest.TestCase):
    """tests/kernel-bench.config is tests/kernel.config without the debug options (each turned
    off explicitly where it has a prompt), plus perf events: the same base, nothing else."""

    DEBUG = {
        "CONFIG_RUST_OVERFLOW_CHECKS", "CONFIG_RUST_DEBUG_ASSERTIONS", "CONFIG_DEBUG_KERNEL",
        "CONFIG_KASAN", "CONFIG_KASAN_GENERIC", "CONFIG_KASAN_INLINE", "CONFIG_PROVE_LOCKING",
        "CONFIG_DEBUG_ATOMIC_SLEEP", "CONFIG_DEBUG_KMEMLEAK", "CONFIG_DEBUG_KMEMLEAK_AUTO_SCAN",
        "CONFIG_DMA_API_DEBUG", "CONFIG_DEBUG_LIST", "CONFIG_DEBUG_OBJECTS",
        "CONFIG_DEBUG_OBJECTS_FREE", "CONFIG_DEBUG_OBJECTS_TIMERS", "CONFIG_DEBUG_OBJECTS_WORK",
        "CONFIG_DEBUG_OBJECTS_RCU_HEAD", "CONFIG_DEBUG_OBJECTS_PERCPU_COUNTER",
        "CONFIG_DEBUG_OBJECTS_ENABLE_DEFAULT",
        "CONFIG_FAULT_INJECTION", "CONFIG_FAILSLAB", "CONFIG_FAULT_INJECTION_DEBUG_FS",
        "CONFIG_DMABUF_DEBUG",
        # Not debug options as such, but they depend on DEBUG_KERNEL.
        "CONFIG_SOFTLOCKUP_DETECTOR", "CONFIG_DETECT_HUNG_TASK",
        # The test kernel's unwinder (cheaper stack walks for KASAN and kmemleak under TCG); the
        # bench kernel keeps the x86 default, ORC.
        "CONFIG_UNWINDER_FRAME_POINTER",
    }

    @staticmethod
    def options(name):
        opts = {}
        for line in (TOP / "tests" / name).read_text().splitlines():
            if line.startswith("CONFIG_"):
                key, val = line.split("=", 1)
                opts[key] = val
        return opts

    def test_bench_is_test_without_debug(self):
        test, bench = self.options("kernel.config"), self.options("kernel-bench.config")
        self.assertLessEqual(self.DEBUG & set(test), set(test))
        for key, val in test.items():
            if key in self.DEBUG:
                self.assertIn(bench.get(key, "n"), ("n",), f"{key} is on in the bench kernel")
            else:
                self.assertEqual(bench.get(key), val, f"{key}: the bench base differs from the test base")
        extra = {k: v for k, v in bench.items() if k not in test}
        self.assertEqual(extra, {"CONFIG_PERF_EVENTS": "y"})
        for key in ("CONFIG_KASAN", "CONFIG_PROVE_LOCKING", "CONFIG_RUST_OVERFLOW_CHECKS"):
            self.assertEqual(test[key], "y")


if __name__ == "__main__":
    unittest.main(verbosity=2)
