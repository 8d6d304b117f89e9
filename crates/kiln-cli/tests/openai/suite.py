"""The runner both client suites share: each check runs in turn, prints PASS or FAIL (with the
traceback) and its time; the process exits 1 when any failed."""

import sys
import time
import traceback


def run_checks(checks, only, label):
    """Runs the functions `checks` (their names start with `check_`) whose name contains `only`
    (all when `only` is None), then exits."""
    failed = []
    start = time.monotonic()
    chosen = [c for c in checks if not only or only in c.__name__]
    for check in chosen:
        name = check.__name__.removeprefix("check_")
        t0 = time.monotonic()
        try:
            check()
            status = "PASS"
        except Exception:
            status = "FAIL"
            failed.append(name)
            traceback.print_exc(file=sys.stdout)
        print(f"{status} {name} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"{label}: {len(chosen) - len(failed)} of {len(chosen)} checks passed in {time.monotonic() - start:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    sys.exit(1 if failed else 0)
