#!/usr/bin/env python3
"""The walk-throughs for contributors (docs/adding_a_*.md) name files and code that exist.

    doc_paths.py ROOT

Every backquoted file path (a word with a '/' and an extension, or a folder, relative to the
repository root or to engine/) must exist, and every backquoted C++ name (`Name`,
`Class::member`, `function`) must be named in engine/, cli/, tests/ or tools/ (`Class::member`:
the class and the member both), so the pages change with the code they walk through. Names with a
'.' (PyTorch's, such as `DeviceMesh._flatten`) and YAML (`mode: replicate`) are not C++ and are not
checked; a page may list more of those words in `NOT_CODE` below.
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

ROOT = sys.argv[1]
check = Checks()
PAGES = sorted(glob.glob(f"{ROOT}/docs/adding_a_*.md"))
PATH = re.compile(r"^[\w.\-]+(/[\w.\-*]+)+/?$")
NAME = re.compile(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)*(\(\))?$")
NOT_CODE = {"mesh_dim", "fully_shard", "replicate", "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "verify",
            "explain", "plan", "golden", "PTOOL_FAULT", "HYBRID_SHARD"}

code = []
for top in ("engine", "cli", "tests", "tools"):
    for path in glob.glob(f"{ROOT}/{top}/**/*", recursive=True):
        if path.endswith((".h", ".cpp", ".cu", ".py")):
            code.append(open(path, errors="replace").read())
code = "\n".join(code)


def exists(path):
    p = path.rstrip("/")
    return any(os.path.exists(os.path.join(ROOT, base, p)) for base in ("", "engine"))


def defined(name):
    parts = name.removesuffix("()").split("::")
    return all(re.search(rf"\b{re.escape(p)}\b", code) for p in parts)


check(PAGES, f"no docs/adding_a_*.md under {ROOT}")
for page in PAGES:
    text = open(page).read()
    # backquoted spans outside fenced blocks (a block is an example, checked by doc_examples.py)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", prose)
    paths = names = 0
    for span in spans:
        s = span.strip()
        if PATH.match(s) and ("." in s.rsplit("/", 1)[-1] or s.endswith("/")) and "*" not in s:
            paths += 1
            check(exists(s), f"{os.path.basename(page)}: `{s}` is no file of the repository")
        elif PATH.match(s) and "*" not in s and not s.startswith(("docs/", "plans/", "models/")):
            paths += 1
            check(exists(s), f"{os.path.basename(page)}: `{s}` is no folder of the repository")
        elif NAME.match(s) and s not in NOT_CODE and ("::" in s or "_" in s or s[0].isupper()):
            names += 1
            check(defined(s), f"{os.path.basename(page)}: `{s}` is named nowhere in engine/, cli/, tests/ or tools/")
    print(f"{os.path.basename(page)}: {paths} paths, {names} code names")
check.finish()
