#!/usr/bin/env python3
"""`make test`: the module structure of the production crates.

- No import loops in production code (every crate but the test harness and the model): no two
  modules of a crate reach each other through `crate::`, `super::`, `self::` or child paths.
  A module naming its own ancestor (`super::Handler` in a child of the module that defines
  `Handler`) is part of that ancestor and does not count.
- The domain's layers (`crates/orderfleet/src/domain`, one folder each, and the crates below it
  that `CRATE_LAYERS` names: the order's words, Stripe's client) are printed in their order,
  and every import in the domain goes down that order or stays in its layer (`LAYERS`: what
  each layer may import; naming a crate of `CRATE_LAYERS` imports its layer), and no module
  makes an import `NEVER` forbids. A planted back-import (a record or the door naming the
  payments crate, a step running the sweeper) fails here, naming the file; the script first
  checks itself on such plants. What the crates below import is the compiler's to keep: each
  depends on the runtime and the words alone.
- The longest chain of imports in the domain is printed, and is at most `LONGEST_CHAIN`
  modules: a reader follows a step down at most that many files.

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
# The domain's layers, bottom first, and the layers each may import (its own always): the table
# in crates/orderfleet/src/domain/mod.rs.
LAYERS = {
    "words": set(),
    "tokens": {"words"},
    "records": {"words"},
    "payments": {"words"},
    "door": {"words", "records"},
    "steps": {"words", "records", "payments"},
    "recovery": {"words", "records", "payments", "steps"},
}
# The crates below the domain that are layers of it: a module naming one imports its layer.
CRATE_LAYERS = {
    "orderfleet_words": "words",
    "orderfleet_payments": "payments",
}
# Imports no module makes even within what its layer allows: (importer, imported) prefixes.
NEVER = [
    # Fulfilment works on an authorized order; how it was authorized is not its business.
    (("domain", "steps", "fulfilment"), ("domain", "steps", "authorization")),
    # The door answers before any payment call, and records are rows.
    (("domain", "door"), ("domain", "steps")),
]
# The folders that hold a layer of several modules: a unit of the chain is one module in them.
LAYER_FOLDERS = {"words", "records", "steps", "recovery"}


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


def crate_imports(modules):
    """Which crates of `CRATE_LAYERS` each module names, outside its tests."""
    named = {}
    for module, path in modules.items():
        text = without_tests(open(path, encoding="utf-8").read())
        named[module] = {c for c in CRATE_LAYERS if re.search(r"(?<![\w:])" + c + "::", text)}
    return named


def layer_problems(edges, paths, crates=None):
    """Every import in the domain that goes up the layers, or that `NEVER` forbids; `crates`:
    the crates of `CRATE_LAYERS` each module names."""
    problems = []
    for module, named in sorted((crates or {}).items()):
        if module[:1] != ("domain",) or len(module) < 2:
            continue
        mine = module[1]
        for crate in sorted(named):
            theirs = CRATE_LAYERS[crate]
            if mine in LAYERS and theirs != mine and theirs not in LAYERS[mine]:
                problems.append(f"{paths.get(module, module)}: the layer {mine} names {crate}, the layer "
                                f"{theirs}, which it may not (it may: {', '.join(sorted(LAYERS[mine])) or 'nothing'})")
    for module, targets in sorted(edges.items()):
        if module[:1] != ("domain",) or len(module) < 2:
            continue
        for target in sorted(targets):
            if target[:1] != ("domain",) or len(target) < 2:
                continue
            (mine, theirs) = (module[1], target[1])
            if mine not in LAYERS or theirs not in LAYERS:
                problems.append(f"{paths.get(module, module)}: {'::'.join(module)} or {'::'.join(target)} "
                                f"is in no layer of LAYERS")
            elif theirs != mine and theirs not in LAYERS[mine]:
                problems.append(f"{paths.get(module, module)}: the layer {mine} imports {'::'.join(target)}, "
                                f"of the layer {theirs}, which it may not (it may: {', '.join(sorted(LAYERS[mine])) or 'nothing'})")
            for importer, imported in NEVER:
                if module[: len(importer)] == importer and target[: len(imported)] == imported:
                    problems.append(f"{paths.get(module, module)}: {'::'.join(module)} imports "
                                    f"{'::'.join(target)}, which it never may")
    return problems


def check_itself():
    """The layer check on planted back-imports: a record and the door calling Stripe, a step
    running the sweeper, fulfilment importing the authorization. Each must be found, or the
    check proves nothing."""
    planted = {
        ("domain", "steps", "refusal"): {("domain", "recovery", "sweeper")},
        ("domain", "steps", "fulfilment"): {("domain", "steps", "authorization")},
    }
    calls_stripe = {
        ("domain", "records", "order"): {"orderfleet_payments"},
        ("domain", "door", "sold_out"): {"orderfleet_payments"},
        ("domain", "steps", "webhook"): {"orderfleet_payments", "orderfleet_words"},
    }
    found = layer_problems(planted, {}, calls_stripe)
    if len(found) != 4:
        sys.exit(f"check-shape: the layer check missed a planted back-import: {found}")


def longest_chain(edges, within):
    """The longest chain of imports among the modules right under `within` (a module path), as
    the list of their names: how many modules a reader follows down from one of them. A module
    split into files (`payments/client.rs`, …) counts as one: its files' imports of each other
    are its own."""
    def top(m):
        if len(m) > len(within) + 1 and m[len(within)] in LAYER_FOLDERS:
            return m[: len(within) + 2]
        return m[: len(within) + 1]

    inside = {top(m) for m in edges if m[: len(within)] == within and len(m) > len(within)
              and not (len(m) == len(within) + 1 and m[-1] in LAYER_FOLDERS)}
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
    check_itself()
    problems = list(import_loops())
    modules = crate_modules("orderfleet")
    edges = module_edges(modules)
    paths = {m: os.path.relpath(p, ROOT) for m, p in modules.items()}
    folders = {m[1] for m in modules if m[:1] == ("domain",) and len(m) > 1}
    below = {layer: crate for crate, layer in CRATE_LAYERS.items()}
    order = " < ".join(
        layer + (f" ({'and ' if layer in folders else ''}the crate {below[layer]})" if layer in below else "")
        for layer in LAYERS)
    print(f"check-shape: the domain's layers, bottom first: {order}")
    problems += layer_problems(edges, paths, crate_imports(modules))
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
    print("check-shape: no import loops, every import in the domain goes down its layers, "
          "and its import chains within their bound")


if __name__ == "__main__":
    main()
