"""The pass/fail count the end-to-end test scripts share: check(ok, what) counts and prints each
failure; finish() prints the totals and exits 1 if anything failed."""
import sys


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what):
        """Counts and returns ok (so `if not check(...): continue` skips what depends on it)."""
        ok = bool(ok)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL:", what)
        return ok

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
