#!/usr/bin/env python3
"""`make test`: the docs name only tests, files and settings that exist.

Every `backticked` name in the README, CHANGELOG.md, BENCHMARKS.md, docs/, docs/decisions/ and
the crates' READMEs is looked up: a test (`faults::a_…`,
`orderfleet::runtime::consumer::poller::tests::…`, a name cut short with `…` matches any test it
begins) must be a function in its file; a path (`crates/…`, `docs/…`, `scripts/…`, …) must exist;
a setting (`STRIPE_MAX_REQUESTS_PER_SECOND`) must be read somewhere in the code, the scripts or
the templates. A doc that names what was renamed fails here, with the file and line to fix.
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "CHANGELOG.md", "BENCHMARKS.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT)),
        *sorted(glob.glob("docs/decisions/*.md", root_dir=ROOT)),
        *sorted(glob.glob("crates/*/README.md", root_dir=ROOT))]
PATH_ROOTS = ("crates/", "docs/", "scripts/", "migrations/", "infra/", "tests/", "deploy/", "localstack/", ".ci/")
# Where a setting may be read or set: the code, the scripts, the templates and units.
SETTING_SOURCES = ["crates/**/*.rs", "tests/**/*.rs", "scripts/*", "infra/*.yaml", "deploy/**/*",
                   "localstack/**/*", "Makefile", "Dockerfile"]
ELLIPSIS = "…"


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def files(patterns):
    for pattern in patterns:
        for path in glob.glob(pattern, root_dir=ROOT, recursive=True):
            if os.path.isfile(os.path.join(ROOT, path)):
                yield path


def functions(source):
    return set(re.findall(r"\bfn\s+([a-z_][a-z0-9_]*)", source))


def e2e_module(path):
    """`tests/e2e/faults/stripe.rs` → `faults::stripe`; a `mod.rs` is its folder's module."""
    parts = os.path.relpath(path, "tests/e2e")[:-3].split(os.sep)
    return "::".join(parts[:-1] if parts[-1] == "mod" else parts)


E2E = {e2e_module(p): functions(read(p)) for p in files(["tests/e2e/**/*.rs"])}
CRATE_SOURCES = {}
for manifest in files(["crates/*/Cargo.toml"]):
    directory = os.path.dirname(manifest)
    text = read(manifest)
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1).replace("-", "_")
    CRATE_SOURCES[name] = set()
    for path in files([f"{directory}/src/**/*.rs", f"{directory}/tests/**/*.rs"]):
        CRATE_SOURCES[name] |= functions(read(path))
ALL_FUNCTIONS = set().union(*CRATE_SOURCES.values(), *E2E.values())
SETTINGS_TEXT = "\n".join(read(p) for p in files(SETTING_SOURCES))


def matches(name, known):
    if name.endswith(ELLIPSIS):
        prefix = name[: -len(ELLIPSIS)].rstrip("_")
        return any(f.startswith(prefix) for f in known)
    return name in known


def check_test(token):
    """A `module::…::function` name: `None` if fine, else why not."""
    parts = token.split("::")
    last = parts[-1]
    if not re.fullmatch(r"[a-z_][a-z0-9_]*" + ELLIPSIS + "?", last):
        return None  # a type or a module path, not a function
    if parts[0] in E2E:
        module = "::".join(parts[:-1])
        if module in E2E and not matches(last, E2E[module]):
            return f"no test {last} in the e2e module {module}"
        if module not in E2E and "::".join(parts) not in E2E:
            return f"no e2e module {module}"
        return None
    if last == "tests" or last.endswith("_tests"):
        return None  # a test module
    crate = parts[0] if parts[0] in CRATE_SOURCES else None
    known = CRATE_SOURCES[crate] if crate else ALL_FUNCTIONS
    if len(parts) > 1 and "tests" in parts[:-1] and not matches(last, known):
        return f"no test {last}"
    if parts[-2:-1] and parts[-2] == "tests":
        return None
    # `authorization::resume`, `db::begin`: a function or a module; a function must exist.
    if not matches(last, ALL_FUNCTIONS) and not any(
            os.path.basename(p)[:-3] == last for p in files(["crates/**/*.rs"])):
        return f"no function or module {last}"
    return None


def check_path(token, doc):
    """A path from the repository's root, or (in a crate's README) from the crate's."""
    path = token.split(":")[0].rstrip("/")
    if ELLIPSIS in path or "<" in path:
        return None
    bases = [ROOT, os.path.join(ROOT, os.path.dirname(doc))]
    if any(c in path for c in "*?["):
        found = any(glob.glob(path, root_dir=base) for base in bases)
        return None if found else f"nothing matches {path}"
    return None if any(os.path.exists(os.path.join(base, path)) for base in bases) else f"no file {path}"


def check_setting(token):
    return None if re.search(r"\b" + re.escape(token) + r"\b", SETTINGS_TEXT) else f"no setting {token} in the code"


def main():
    problems = []
    checked = {"test": 0, "path": 0, "setting": 0}
    for doc in DOCS:
        for number, line in enumerate(read(doc).splitlines(), 1):
            for token in re.findall(r"`([^`\n]+)`", line):
                token = token.strip()
                why = None
                if re.fullmatch(r"[a-z_][a-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)+" + ELLIPSIS + "?", token):
                    why = check_test(token)
                    checked["test"] += 1
                elif token.startswith(PATH_ROOTS) and " " not in token:
                    why = check_path(token, doc)
                    checked["path"] += 1
                elif re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+", token):
                    why = check_setting(token)
                    checked["setting"] += 1
                if why:
                    problems.append(f"{doc}:{number}: `{token}`: {why}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check-docs: {len(problems)} name(s) in the docs that the code does not have", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {kind}s" for kind, n in checked.items())
    print(f"check-docs: every name in {len(DOCS)} docs exists ({counts} looked up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
