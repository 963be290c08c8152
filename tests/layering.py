#!/usr/bin/env python3
"""docs/architecture.md's table of what each engine folder includes is what the code includes.

    layering.py ROOT

Reads every `#include "folder/..."` under engine/ (and cli/), and fails unless, for every
folder, the set of other folders its files include is the set the table in docs/architecture.md
("Layout and layers") lists, so the page that describes the layers changes with the code that
changes them.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

ROOT = sys.argv[1]
check = Checks()
FOLDERS = sorted(d for d in os.listdir(f"{ROOT}/engine") if os.path.isdir(f"{ROOT}/engine/{d}"))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.M)

actual = {}
for top, base in (("engine", None), ("cli", "cli")):
    for d, _, files in os.walk(f"{ROOT}/{top}"):
        rel = os.path.relpath(d, f"{ROOT}/{top}")
        folder = base or rel.split(os.sep)[0]
        if folder == ".":
            continue  # engine/CMakeLists.txt
        for f in files:
            if f.endswith((".h", ".cpp", ".cu", ".cuh")):
                used = {u for u in INCLUDE.findall(open(os.path.join(d, f), errors="replace").read()) if u in FOLDERS}
                actual.setdefault(folder, set()).update(used - {folder})

doc = open(f"{ROOT}/docs/architecture.md").read()
table = {}
for folder, includes in re.findall(r"^\| (\w+) \| ([a-z, ]+?) \|", doc, re.M):
    if folder in FOLDERS or folder == "cli":
        table[folder] = set() if includes == "nothing" else set(FOLDERS) if includes == "every folder" else \
            {w.strip() for w in includes.split(",")}

check(set(table) == set(actual), f"docs/architecture.md lists folders {sorted(table)}, the code has {sorted(actual)}")
# cmake/check_layers.cmake declares the same layers (the build fails on an include outside them)
cmake_text = open(f"{ROOT}/cmake/check_layers.cmake").read()
declared = {f: set(deps.split()) - {'""'} for f, deps in re.findall(r'^set\(ptool_layer_(\w+) ([^)]*)\)', cmake_text, re.M)}
for folder in sorted(set(table) - {"cli"}):
    check(declared.get(folder) == table[folder], f"{folder}: cmake/check_layers.cmake declares {sorted(declared.get(folder, []))}, "
          f"docs/architecture.md's table {sorted(table[folder])}")
for folder in sorted(actual):
    doc_set, code_set = table.get(folder, set()), actual[folder]
    if folder == "cli":
        doc_set = doc_set - {"cli"}
    check(doc_set == code_set, f"{folder}: docs/architecture.md says it includes {sorted(doc_set)}, the code includes "
          f"{sorted(code_set)} (added {sorted(code_set - doc_set)}, gone {sorted(doc_set - code_set)})")
print("\n".join(f"{f:<9} -> {', '.join(sorted(actual[f])) or 'nothing'}" for f in sorted(actual)))
check.finish()
