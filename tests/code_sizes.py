#!/usr/bin/env python3
"""Issue 51's sizes hold: no engine or cli source file over 600 lines, no function over 120.

    code_sizes.py ROOT

A function is a brace block opened at namespace or class level whose head (the text since the
last `;`, `{` or `}` at that level) has a parameter list and is not a type, namespace, enum or
initializer: its length is from the head's first line to the closing brace. Lambdas and control
blocks inside a function count toward it. Comments, strings and character literals are skipped.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

ROOT = sys.argv[1]
MAX_FILE, MAX_FUNCTION = 600, 120
EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
SCOPE = re.compile(r"\b(namespace|struct|class|union|enum)\b[^()]*$|\bextern\s+\"C\"\s*$")


def code_only(text):
    """text with comments, strings and character literals blanked (newlines kept)"""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (m := re.match(r'R"([^(\s]*)\(', text[i:])):
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # (digit separators)
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, lines) of every function body at namespace or class level"""
    code = code_only(text)
    stack = []  # per open brace: "scope", "function" or "other"
    head_start, found = 0, []
    for i, c in enumerate(code):
        if c in ";{}":
            inside = any(k[0] != "scope" for k in stack)
            if c == "{":
                head = code[head_start:i]
                if inside:
                    kind = "other"
                elif SCOPE.search(head.strip()) or "(" not in head or head.rstrip().endswith("="):
                    kind = "scope" if SCOPE.search(head.strip()) else "other"
                else:
                    kind = "function"
                    start = head_start + len(head) - len(head.lstrip())
                    name = re.findall(r"([~\w:]+)\s*\(", head)
                    stack.append((kind, start, name[0] if name else "?"))
                    head_start = i + 1
                    continue
                stack.append((kind, i, ""))
            elif c == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    first = code.count("\n", 0, start) + 1
                    last = code.count("\n", 0, i) + 1
                    found.append((name, first, last - first + 1))
            head_start = i + 1
    return found


check = Checks()
for top in ("engine", "cli"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
        for f in sorted(files):
            if not f.endswith(EXTENSIONS):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            lines = text.count("\n")
            check(lines <= MAX_FILE, f"{rel}: {lines} lines (at most {MAX_FILE})")
            for name, first, length in functions(text):
                check(length <= MAX_FUNCTION, f"{rel}:{first}: {name} is {length} lines (at most {MAX_FUNCTION})")
check.finish()
