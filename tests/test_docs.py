#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The documentation has no unfinished markers: TBD, TODO, FIXME or XXX (upper case, as a word or
part of an identifier such as DEFAULT_TBD) in README.md, Documentation/**/*.rst, the sysfs ABI
files (Documentation/ABI/), tools/*/README.md and the UAPI headers (include/uapi/**/*.h). Run with the parser's tests (make check, stage 2).
That udmactl's documentation lists every command of its clap definition is a cargo test of
tools/neuron-udma (docs_list_every_command, stage 3)."""

import pathlib
import re
import unittest

TOP = pathlib.Path(__file__).resolve().parent.parent
# A marker: not inside a longer word or number (an underscore does not protect it).
MARKER = re.compile(r"(?<![A-Za-z0-9])(TBD|TODO|FIXME|XXX)(?![A-Za-z0-9])")


def documents(top=TOP):
    """The files the rule covers, relative to `top`, sorted."""
    files = [top / "README.md"]
    files += (top / "Documentation").rglob("*.rst")
    files += (top / "Documentation" / "ABI").rglob("*")
    files += top.glob("tools/*/README.md")
    files += (top / "include" / "uapi").rglob("*.h")
    return sorted(p for p in files if p.is_file())


def markers(path):
    """(line number, marker, line) of every marker in `path`."""
    found = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        found += [(n, m.group(1), line.strip()) for m in MARKER.finditer(line)]
    return found


class Docs(unittest.TestCase):
    def test_no_unfinished_markers(self):
        bad = [f"{p.relative_to(TOP)}:{n}: {m}: {line}" for p in documents() for n, m, line in markers(p)]
        self.assertEqual(bad, [], "unfinished markers in the documentation:\n" + "\n".join(bad))

    def test_the_rule_covers_its_files(self):
        names = {str(p.relative_to(TOP)) for p in documents()}
        for want in ["README.md", "Documentation/userspace-api.rst", "Documentation/neuron-udma.rst",
                     "tools/neuron-udma/README.md",
                     "include/uapi/linux/neuron_udma.h", "Documentation/ABI/testing/sysfs-driver-neuron_udma"]:
            self.assertIn(want, names)

    def test_marker_pattern(self):
        for text in ["The default is DEFAULT_TBD.", "TODO: fix", "(FIXME)", "XXX", "a TBD value"]:
            self.assertTrue(MARKER.search(text), text)
        for text in ["TODOS", "XXXL", "0xXXX1", "tbd", "todo", "FIXMEs", "ATBD"]:
            self.assertFalse(MARKER.search(text), text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
