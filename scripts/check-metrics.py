#!/usr/bin/env python3
"""`make test`: every metric is declared once, in its crate's `src/metrics.rs`.

- Each production crate that records a metric has a `src/metrics.rs` that declares each of them
  (`Metric::counter|gauge|histogram(name, labels, help)`) and lists them all in `ALL`; a name
  is declared once in the workspace.
- Code records a metric only by its declaration (`metrics::counter!(crate::metrics::X.name,
  …)`), never by a name written at the call, and with the labels the declaration gives.
- `docs/operations.md`'s table of metrics is the declarations' (`--write` writes it).
- The CloudWatch names the templates in `infra/` read in the fleet's namespace are those the
  relay declares it puts (`CLOUDWATCH` in `crates/outbox-relay/src/metrics.rs`).

It reads the code as text.
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_PRODUCTION = ("fleet-harness", "order-model")
DOC = os.path.join(ROOT, "docs", "operations.md")
BEGIN = "<!-- metrics: written by scripts/check-metrics.py --write from each crate's src/metrics.rs -->"
END = "<!-- metrics: end -->"

DECLARATION = re.compile(
    r'pub const (\w+): Metric =\s*Metric::(counter|gauge|histogram)\(\s*"([a-z_]+)",\s*&\[([^\]]*)\],\s*"((?:[^"\\]|\\.)*)",?\s*\);',
    re.S,
)
RECORDING = re.compile(r"metrics::(counter|gauge|histogram)!\(")


def recordings(text):
    """(kind, name expression, label names) of each recording in `text`."""
    for start in RECORDING.finditer(text):
        depth, i = 1, start.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = text[start.end() : i - 1]
        name = re.split(r",", args, maxsplit=1)[0].strip()
        yield start.group(1), name, re.findall(r'"([a-z_]+)"\s*=>', args)


def crates():
    for path in sorted(glob.glob(os.path.join(ROOT, "crates", "*", "src"))):
        name = os.path.basename(os.path.dirname(path))
        if name not in NOT_PRODUCTION:
            yield name, path


def declarations(problems):
    """{crate: [(const, kind, name, labels, help)]}"""
    found, names = {}, {}
    for crate, src in crates():
        path = os.path.join(src, "metrics.rs")
        if not os.path.exists(path):
            continue
        text = open(path).read()
        listed = re.search(r"pub const ALL: &\[Metric\] =\s*&\[([^\]]*)\];", text, re.S)
        listed = set(re.findall(r"\w+", listed.group(1))) if listed else set()
        entries = []
        for const, kind, name, labels, help_ in DECLARATION.findall(text):
            labels = re.findall(r'"([a-z_]+)"', labels)
            entries.append((const, kind, name, labels, help_.replace('\\"', '"')))
            if const not in listed:
                problems.append(f"{crate}/src/metrics.rs: {const} is not in ALL")
            if name in names:
                problems.append(f"{name} is declared twice: in {names[name]} and {crate}")
            names[name] = crate
        declared = {e[0] for e in entries}
        for const in listed - declared:
            problems.append(f"{crate}/src/metrics.rs: ALL lists {const}, which it does not declare")
        found[crate] = entries
    return found


def check_recordings(found, problems):
    by_const = {(crate, e[0]): e for crate, entries in found.items() for e in entries}
    for crate, src in crates():
        for path in glob.glob(os.path.join(src, "**", "*.rs"), recursive=True):
            if path.endswith(os.sep + "metrics.rs") and os.path.dirname(path) == src:
                continue
            text = open(path).read()
            rel = os.path.relpath(path, ROOT)
            for kind, name, labels in recordings(text):
                if re.fullmatch(r"[a-z_]+\.name", name) and "Metric" in text:
                    # A metric passed along (a loop over declarations): its declaration is checked.
                    continue
                m = re.fullmatch(r"(crate|\w+)::metrics::(\w+)\.name", name)
                if not m:
                    problems.append(f"{rel}: records {name} by a name, not by its declaration in src/metrics.rs")
                    continue
                owner = crate if m.group(1) == "crate" else m.group(1).replace("_", "-")
                entry = by_const.get((owner, m.group(2)))
                if entry is None:
                    problems.append(f"{rel}: {name} is not declared in {owner}/src/metrics.rs")
                elif entry[1] != kind:
                    problems.append(f"{rel}: {entry[2]} is a {entry[1]}, recorded as a {kind}")
                elif labels != entry[3]:
                    problems.append(f"{rel}: {entry[2]} recorded with labels {labels}, declared {entry[3]}")


def table(found):
    rows = ["| metric | kind | labels | what it counts | declared in |", "|---|---|---|---|---|"]
    for crate, entries in found.items():
        for _, kind, name, labels, help_ in entries:
            labels = ", ".join(labels)
            rows.append(f"| `{name}` | {kind} | {labels} | {help_} | `crates/{crate}/src/metrics.rs` |")
    return "\n".join([BEGIN, *rows, END])


def check_doc(found, problems, write):
    text = open(DOC).read()
    if BEGIN not in text or END not in text:
        problems.append(f"docs/operations.md has no table of metrics between {BEGIN!r} and {END!r}")
        return
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    wanted = head + table(found) + tail
    if wanted != text:
        if write:
            open(DOC, "w").write(wanted)
        else:
            problems.append("docs/operations.md's table of metrics is not the declarations': run scripts/check-metrics.py --write")


def check_cloudwatch(problems):
    relay = open(os.path.join(ROOT, "crates", "outbox-relay", "src", "metrics.rs")).read()
    put = set(re.findall(r'\(\w+, "([A-Za-z]+)", Unit::\w+\)', relay))
    if not put:
        problems.append("crates/outbox-relay/src/metrics.rs declares no CloudWatch names")
    for path in sorted(glob.glob(os.path.join(ROOT, "infra", "*.yaml"))):
        text = open(path).read()
        rel = os.path.relpath(path, ROOT)
        read = set(re.findall(r'"orderfleet/\$\{AWS::StackName\}", "([A-Za-z]+)"', text))
        for alarm in re.finditer(r'Namespace: !Sub "orderfleet/\$\{AWS::StackName\}"\s*\n\s*MetricName: (\w+)', text):
            read.add(alarm.group(1))
        for name in sorted(read - put):
            problems.append(f"{rel} reads the CloudWatch metric {name}, which the relay does not put")


def main():
    write = "--write" in sys.argv[1:]
    problems = []
    found = declarations(problems)
    check_recordings(found, problems)
    check_doc(found, problems, write)
    check_cloudwatch(problems)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    total = sum(len(e) for e in found.values())
    print(f"metrics: {total} declared in {len(found)} crates' src/metrics.rs, each recorded by its declaration; docs/operations.md's table and infra/'s CloudWatch names agree")


if __name__ == "__main__":
    main()
