#!/usr/bin/env python3
"""The transcripts in README.md and docs/*.md print what they say.

    doc_examples.py PTOOL ROOT

A transcript is a fenced block whose lines start with `$ `: each such line is a command, and the
lines after it (up to the next `$ ` or the block's end) are what it prints. Every `ptool` command
(with its environment, e.g. PTOOL_FAULT=...) runs in a scratch folder that sees the repository's
models/, plans/, clusters/ and golden/, in the order written (a later command may read an earlier
one's -o file); each shown line must be one it printed. `...` alone stands for lines left out, a
line ending in `...` for the rest of that line; wall times (`reference 0.12 ms, parallel 1.30 ms`,
`simulated in 0.79 s`) are not compared, nor the widths of table columns. Nor are rounding-level
differences: the error columns of a tensor that agrees (`... 8.94e-08 4.40e-06 39 0.009 - ok`) and
the `agreed (max rel 1.3e-07)` of a first divergence's predecessor depend on the kernels OpenBLAS
picks for the CPU (a Sapphire Rapids and a Skylake machine round differently); a failing tensor's
numbers, a fault's magnitude and every verdict are compared. Other programs (bench binaries, mpirun) are not run.
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = Checks()

NUM = r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)"
WALL = [(re.compile(r"\b(reference|parallel) [\d.]+ ms"), r"\1 T ms"), (re.compile(r"simulated in [\d.]+ s"), "simulated in T s"),
        # rounding-level numbers (the CPU's BLAS kernels): an agreeing tensor's error columns, an agreement's max rel
        (re.compile(rf"^(\s*step\d+\.\S+)\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}(\s+\S+\s+ok\b)"), r"\1 ~ ~ ~ ~\2"),
        (re.compile(rf"agreed \(max rel {NUM}\)"), "agreed (max rel ~)")]


def normal(line):  # wall times out, runs of spaces (column widths) as one
    for pattern, to in WALL:
        line = pattern.sub(to, line)
    return re.sub(r"(?<=\S) {2,}", " ", line.rstrip())


def transcripts(path):
    """(line number, command, [shown lines]) of every `$ ` command in the file's fenced blocks."""
    out, fenced, current = [], False, None
    for n, line in enumerate(open(path).read().splitlines(), 1):
        if line.startswith("```"):
            fenced, current = not fenced, None
        elif fenced and line.startswith("$ "):
            current = (n, line[2:], [])
            out.append(current)
        elif fenced and current:
            current[2].append(line)
    return out


def matches(shown, printed):
    s = normal(shown)
    if s.strip() == "...":
        return True
    if s.endswith("..."):
        prefix = s[:-3].rstrip(" ·")
        return any(p.startswith(prefix) for p in printed)
    return s in printed


commands = 0
with tempfile.TemporaryDirectory() as tmp:
    for d in ("models", "plans", "clusters", "golden"):
        os.symlink(os.path.join(ROOT, d), os.path.join(tmp, d))
    for doc in [f"{ROOT}/README.md"] + sorted(glob.glob(f"{ROOT}/docs/*.md")):
        for n, command, shown in transcripts(doc):
            words = shlex.split(command, comments=True)
            env = dict(os.environ)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                k, v = words.pop(0).split("=", 1)
                env[k] = v
            if not words or words[0] != "ptool":
                continue  # a bench binary, mpirun: not run here
            where = f"{os.path.relpath(doc, ROOT)}:{n}: `{command}`"
            p = subprocess.run([PTOOL, *words[1:]], capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
            printed = [normal(line) for line in (p.stdout + p.stderr).splitlines()]
            missing = [line for line in shown if not matches(line, printed)]
            check(not missing, f"{where} (exit {p.returncode}) did not print:\n" + "\n".join(f"  {m!r}" for m in missing)
                  + "\nit printed:\n" + "\n".join(printed[-40:]))
            commands += 1
check(commands >= 10, f"only {commands} documented commands found")
print(f"{commands} documented ptool commands run")
check.finish()
