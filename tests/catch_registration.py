#!/usr/bin/env python3
"""Every Catch2 test case is one ctest test of the same name, run by that name.

catch_discover_tests (tests/CMakeLists.txt) reads a binary's --list-test-names-only into a CMake
list: a ';' in a test case's name split it into pieces that named no test case, so ctest ran a
filter matching nothing, which Catch2 v2 reports as a success, and an unclosed '[' joined the
names after it into one. 30 of 192 test cases were not ctest tests of their own (found
2026-11-28; one of them failed). This check lists each binary's test cases and ctest's tests and
requires the two to be the same names, one for one.

usage: catch_registration.py BUILD_DIR BINARY...   (BINARY: a path under BUILD_DIR/tests)
"""
import os
import re
import subprocess
import sys


def catch_names(binary):
    out = subprocess.run([binary, "--list-test-names-only"], capture_output=True, text=True, check=False)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def ctest_names(build_dir, prefixes):
    """ctest's tests named "PREFIX: case" (ctest -N prints them "PREFIX:case"), by prefix."""
    out = subprocess.run(["ctest", "-N"], cwd=build_dir, capture_output=True, text=True, check=True)
    names = {p: [] for p in prefixes}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*Test\s+#\d+: (.*)$", line)
        if not m:
            continue
        prefix, sep, rest = m.group(1).partition(":")
        if sep and prefix in names:
            names[prefix].append(rest.strip())
    return names


def main():
    build_dir, binaries = sys.argv[1], sys.argv[2:]
    registered = ctest_names(build_dir, [os.path.basename(b) for b in binaries])
    failures = 0
    for binary in binaries:
        prefix = os.path.basename(binary)
        cases = catch_names(binary)
        tests = registered.get(prefix, [])
        if not cases:
            print(f"FAIL {prefix}: --list-test-names-only listed no test case")
            failures += 1
            continue
        for name in cases:
            if ";" in name:
                print(f"FAIL {prefix}: test case name has a ';' (a CMake list separator): {name!r}")
                failures += 1
        missing = sorted(set(cases) - set(tests))
        extra = sorted(set(tests) - set(cases))
        for name in missing:
            print(f"FAIL {prefix}: test case not registered with ctest as itself: {name!r}")
        for name in extra:
            print(f"FAIL {prefix}: ctest test that names no test case: {name!r}")
        if len(tests) != len(set(tests)):
            print(f"FAIL {prefix}: a ctest name registered twice")
            failures += 1
        failures += len(missing) + len(extra)
        print(f"{prefix}: {len(cases)} test cases, {len(tests)} ctest tests")
    if failures:
        print(f"{failures} problem(s)")
        return 1
    print("every test case is a ctest test of its own name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
