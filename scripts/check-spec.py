#!/usr/bin/env python3
"""`make test`: the contract in the repo (docs/spec.md) is the contract the project is held to.

The code and docs cite "SPEC §…": that is docs/spec.md. Where the shared copy the project is
judged by is present beside the repository (../shared/SPEC.md), the two must be equal byte for
byte; a fresh clone elsewhere has no shared copy, and the check says it was skipped.
"""

import difflib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "docs", "spec.md")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "SPEC.md")


def main():
    if not os.path.isfile(OURS):
        print("check-spec: docs/spec.md is missing: copy ../shared/SPEC.md there")
        return 1
    if not os.path.isfile(SHARED):
        print("check-spec: skipped: no ../shared/SPEC.md beside this clone to compare docs/spec.md with")
        return 0
    with open(OURS, encoding="utf-8") as f:
        ours = f.read()
    with open(SHARED, encoding="utf-8") as f:
        shared = f.read()
    if ours == shared:
        print("check-spec: docs/spec.md is ../shared/SPEC.md")
        return 0
    diff = difflib.unified_diff(shared.splitlines(), ours.splitlines(), "../shared/SPEC.md", "docs/spec.md", lineterm="")
    print("check-spec: docs/spec.md differs from ../shared/SPEC.md (copy it over):")
    for line in list(diff)[:40]:
        print("  " + line)
    return 1


if __name__ == "__main__":
    sys.exit(main())
