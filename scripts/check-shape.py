#!/usr/bin/env python3
"""`make test`: the module structure of the production crates.

- No import loops in production code (every crate but the test harness and the model): no two
  modules of a crate reach each other through `crate::`, `super::`, `self::` or child paths.
  A module naming its own ancestor (`super::Handler` in a child of the module that defines
  `Handler`) is part of that ancestor and does not count.
- The longest chain of imports in the domain (`crates/orderfleet/src/domain`) is printed, and
  is at most `LONGEST_CHAIN` modules: a reader follows a step down at most that many files.

Rules the compiler can keep are kept there instead: clippy bounds every function to 60 lines
(clippy.toml) and refuses unchecked statements; PostgreSQL refuses a misspelt status when the
query macros prepare a statement (tests/e2e/migrations.rs).

It reads the code as text. Test code is `#[cfg(test)]` items and the `tests/` folders.
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Crates that are not production code: the test harness and the model checker.
NOT_PRODUCTION = ("fleet-harness", "order-model")
# The longest chain of imports allowed in the domain, in modules.
LONGEST_CHAIN = 6


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


def longest_chain(edges, within):
    """The longest chain of imports among the modules right under `within` (a module path), as
    the list of their names: how many modules a reader follows down from one of them. A module
    split into files (`payments/client.rs`, …) counts as one: its files' imports of each other
    are its own."""
    def top(m):
        return m[: len(within) + 1]

    inside = {top(m) for m in edges if m[: len(within)] == within and len(m) > len(within)}
    below = {m: set() for m in inside}
    for m, targets in edges.items():
        if top(m) in inside:
            below[top(m)] |= {top(t) for t in targets if top(t) in inside and top(t) != top(m)}
    best = {}

    def chain(m, seen=()):
        if m not in best:
            tails = [chain(n, seen + (m,)) for n in sorted(below[m]) if n not in seen]
            best[m] = [m] + max(tails, key=len, default=[])
        return best[m]

    return max((chain(m) for m in sorted(inside)), key=len, default=[])


def main():
    problems = list(import_loops())
    edges = module_edges(crate_modules("orderfleet"))
    domain = longest_chain(edges, ("domain",))
    names = " → ".join(m[-1] for m in domain)
    print(f"check-shape: the longest import chain in the domain is {len(domain)} modules: {names}")
    if len(domain) > LONGEST_CHAIN:
        problems.append(f"crates/orderfleet/src/domain: an import chain of {len(domain)} modules "
                        f"(at most {LONGEST_CHAIN}): {names}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(f"check-shape: {len(problems)} problem(s)")
    print("check-shape: no import loops, and the domain's import chains within their bound")


if __name__ == "__main__":
    main()
