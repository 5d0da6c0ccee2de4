#!/usr/bin/env python3
"""`make test`: the code keeps the shape issue 32 gave it.

- No function outside tests is over 60 lines (its signature to its closing brace).
- No order status is spelled in the fleet's SQL: a statement names SPEC §5's sets through the
  functions of migration `status_sets` (`holds_units(status)`, …) or binds the typed
  `OrderStatus` it expects. The fleet is every crate but the test harness, the model and
  stripe-sim.
- No import loops in production code (every crate but the test harness and the model): no two
  modules of a crate reach each other through `crate::`, `super::`, `self::` or child paths.
  A module naming its own ancestor (`super::Handler` in a child of the module that defines
  `Handler`) is part of that ancestor and does not count.

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
# Crates that are not production code: the test harness and the model checker.
NOT_PRODUCTION = ("fleet-harness", "order-model")
STATUSES = ("pending_authorization", "authorized", "stock_reserved", "paid", "rejected_out_of_stock",
            "payment_declined", "capture_failed")
STATUS_LITERAL = re.compile(r"'(%s)'" % "|".join(STATUSES))
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def item_end(lines, start):
    """The index of the line that closes the item starting at `start`, and whether it has a
    body. rustfmt puts an item's closing brace alone at the item's own indentation, which
    braces inside strings never confuse; an item ending in `;` before any body has none."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    for i in range(start, len(lines)):
        line = lines[i].split("//")[0].rstrip() if i == start or not lines[i].strip().startswith('"') else ""
        if i == start or lines[i][:indent].strip() == "":
            if line.endswith(";") and "{" not in line and not any("{" in l for l in lines[start:i]):
                return i, False
            if lines[i].rstrip() == " " * indent + "}" or (i == start and line.endswith("}") and "{" in line):
                return i, True
    return len(lines) - 1, False


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


def crate_modules(crate):
    """Each module of the crate's library and binary (not `src/bin/`) by its path, to its file."""
    src = os.path.join(ROOT, "crates", crate, "src")
    modules = {}
    for path in glob.glob(src + "/**/*.rs", recursive=True):
        parts = os.path.relpath(path, src)[:-3].split("/")
        if parts[0] == "bin":
            continue
        if parts[-1] in ("lib", "main", "mod"):
            parts = parts[:-1]
        modules[tuple(parts)] = path
    return modules


def without_tests(text):
    lines = text.split("\n")
    kept, i = [], 0
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            i = item_end(lines, i + 1)[0] + 1
            continue
        if not lines[i].strip().startswith("//"):
            kept.append(lines[i])
        i += 1
    return "\n".join(kept)


def module_edges(modules):
    """Which modules each module names, leaving out its own ancestors."""
    edges = {module: set() for module in modules}
    for module, path in modules.items():
        text = without_tests(open(path, encoding="utf-8").read())
        named = []
        for found in re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text):
            parts = found.split("::")
            base = ()
            if parts[0] != "crate":
                base = module
                while parts and parts[0] == "super":
                    base, parts = base[:-1], parts[1:]
                if parts and parts[0] == "self":
                    parts = parts[1:]
                parts = ["crate", *parts]
            named.append((tuple(base), parts[1:]))
        for child in {m[-1] for m in modules if len(m) == len(module) + 1 and m[:-1] == module}:
            if re.search(r"(?<![\w:])" + child + "::", text):
                named.append((module, [child]))
        for base, rest in named:
            for k in range(len(rest), -1, -1):
                target = base + tuple(rest[:k])
                if target in modules:
                    if target != module and module[: len(target)] != target:
                        edges[module].add(target)
                    break
    return edges


def loops(edges):
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in edges:
        if v not in index:
            visit(v)
    return groups


def import_loops():
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        if crate in NOT_PRODUCTION or not os.path.isdir(os.path.join(ROOT, "crates", crate, "src")):
            continue
        for group in loops(module_edges(crate_modules(crate))):
            names = sorted("::".join(m) or "crate" for m in group)
            yield f"crates/{crate}: an import loop between {', '.join(names)}"


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
    # A statement kept in a file of its own (`sqlx::query_file!`) is the fleet's SQL too.
    for path in sorted(glob.glob("crates/**/*.sql", root_dir=ROOT, recursive=True)):
        if path.startswith(NOT_THE_FLEET):
            continue
        with open(os.path.join(ROOT, path)) as sql:
            for i, line in enumerate(sql):
                if STATUS_LITERAL.search(line.split("--")[0]):
                    problems.append(f"{path}:{i + 1}: a status spelled in SQL; use the named sets or bind OrderStatus")
    problems.extend(import_loops())
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(f"check-shape: {len(problems)} problem(s)")
    print("check-shape: every function within 60 lines, no status spelled in the fleet's SQL, no import loops")


if __name__ == "__main__":
    main()
