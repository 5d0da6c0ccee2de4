#!/usr/bin/env python3
"""`make test`: the code keeps the shape issue 32 gave it.

- No function outside tests is over 60 lines (its signature to its closing brace).
- No order status is spelled in the fleet's SQL: a statement names SPEC §5's sets through the
  functions of migration `status_sets` (`holds_units(status)`, …) or binds the typed
  `OrderStatus` it expects. The fleet is every crate but the test harness, the model and
  stripe-sim.

It reads the code as text: functions by their braces, string literals as SQL when they hold a
SQL keyword. Test code is `#[cfg(test)]` items and the `tests/` folders.
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONGEST = 60
# Crates whose SQL is the fleet's: statuses there go through the named sets.
NOT_THE_FLEET = ("crates/fleet-harness/", "crates/order-model/", "crates/stripe-sim/")
STATUSES = ("pending_authorization", "authorized", "stock_reserved", "paid", "rejected_out_of_stock",
            "payment_declined", "capture_failed")
STATUS_LITERAL = re.compile(r"'(%s)'" % "|".join(STATUSES))
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def code_of(line):
    """The line without its string and char literals and its comment, for counting braces."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def item_end(lines, start):
    """The index of the line that closes the item starting at `start` (a `;` item: that line)."""
    depth, opened = 0, False
    for i in range(start, len(lines)):
        code = code_of(lines[i])
        if not opened and depth == 0 and code.rstrip().endswith(";") and "{" not in code:
            return i, False
        depth += code.count("{") - code.count("}")
        opened |= "{" in code
        if opened and depth <= 0:
            return i, True
    return len(lines) - 1, opened


def production_lines(path):
    """(line number, text) of the file's lines outside `#[cfg(test)]` items."""
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            end, _ = item_end(lines, i + 1)
            i = end + 1
            continue
        yield i, lines[i], lines
        i += 1


def main():
    problems = []
    for path in sorted(glob.glob("crates/**/*.rs", root_dir=ROOT, recursive=True)):
        if "/tests/" in path or "/benches/" in path:
            continue
        fleet = not path.startswith(NOT_THE_FLEET)
        for i, line, lines in production_lines(path):
            match = FN.match(line)
            if match:
                end, has_body = item_end(lines, i)
                if has_body and end - i + 1 > LONGEST:
                    problems.append(f"{path}:{i + 1}: fn {match.group(6)} is {end - i + 1} lines (at most {LONGEST})")
            if fleet and STATUS_LITERAL.search(line.split("//")[0]):
                problems.append(f"{path}:{i + 1}: a status spelled in SQL; use the named sets or bind OrderStatus")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(f"check-shape: {len(problems)} problem(s)")
    print("check-shape: every function within 60 lines, no status spelled in the fleet's SQL")


if __name__ == "__main__":
    main()
