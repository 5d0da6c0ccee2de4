#!/usr/bin/env python3
"""`make test`: end-to-end test names stay short enough to read in a list.

A test's name states its one claim; its module (the file under tests/e2e/) gives the context,
and a second claim goes in its doc comment. This counts the names in tests/e2e/**/*.rs over
`LONGEST` characters and fails if there are more than `ALLOWED`. A name is a `#[test]` or
`#[tokio::test]` function's, or one a macro there makes a test of: `name: …;` in the
invocation of a `macro_rules!` whose body declares `fn $name`. `--stats` prints, besides,
how many are over 60 characters, the median length and how many join two claims with `_and_`.
"""

import glob
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONGEST = 70
ALLOWED = 10
TEST_ATTRIBUTE = re.compile(r"^\s*#\[(tokio::)?test\b")
FUNCTION = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?fn\s+(\$?\w+)")


def module(path):
    """`tests/e2e/faults/stripe.rs` → `faults::stripe`; a `mod.rs` is its folder's module."""
    parts = os.path.relpath(path, os.path.join(ROOT, "tests/e2e"))[:-3].split(os.sep)
    return "::".join(parts[:-1] if parts[-1] in ("mod", "main") else parts)


def test_names(text):
    """The file's test functions, and the tests its macros make."""
    names, macro_tests, attribute = [], set(), False
    macro = None
    for line in text.split("\n"):
        started = re.match(r"^macro_rules!\s+(\w+)", line)
        if started:
            macro = started.group(1)
        if TEST_ATTRIBUTE.match(line):
            attribute = True
            continue
        found = FUNCTION.match(line)
        if attribute and found:
            if found.group(1).startswith("$"):
                macro_tests.add(macro)
            else:
                names.append(found.group(1))
        if not line.strip().startswith(("#[", "//")):
            attribute = False
    for macro in macro_tests:
        for body in re.findall(r"^" + macro + r"!\s*\{(.*?)^\}", text, re.M | re.S):
            names += re.findall(r"^\s*([a-z_][a-z0-9_]*)\s*:", body, re.M)
    return names


def main():
    names = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/e2e/**/*.rs"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            names += [f"{module(path)}::{name}" for name in test_names(f.read())]
    lengths = {name: len(name.rsplit("::", 1)[1]) for name in names}
    long = sorted((n for n in names if lengths[n] > LONGEST), key=lambda n: -lengths[n])
    for name in long:
        print(f"  {lengths[name]} {name}")
    print(f"check-test-names: {len(long)} of {len(names)} end-to-end test names over {LONGEST} characters "
          f"(at most {ALLOWED})")
    if "--stats" in sys.argv:
        over_60 = sum(length > 60 for length in lengths.values())
        joined = sum("_and_" in n.rsplit("::", 1)[1] for n in names)
        print(f"check-test-names: {over_60} over 60, median {statistics.median(lengths.values())}, "
              f"{joined} with _and_, longest {max(lengths.values())}")
    return 1 if len(long) > ALLOWED else 0


if __name__ == "__main__":
    sys.exit(main())
