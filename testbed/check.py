"""A scenario's checks: each one that fails is kept with what it found, and the scenario fails
with them all (not at the first); and the loop that runs a tier's scenarios."""
import concurrent.futures
import os
import time

from testbed.host import TOP, log


class Check:
    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        if not ok:
            self.failures.append(what)


def run_scenarios(tier, names, one, out):
    """Runs `one(i, name)` for each scenario, two at a time; each returns its name, its failures
    and what it measured (a line). Says PASS or FAIL for each in order (a failure with where its
    console is, `out`/NAME/console.txt), then the count. Returns how many failed (the tool's
    main turns it into its exit code)."""
    t0 = time.time()
    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, failures, figures in pool.map(lambda a: one(*a), enumerate(names)):
            if failures:
                failed += 1
                console = os.path.relpath(os.path.join(out, name, "console.txt"), TOP)
                log(f"FAIL {name}: {figures}; " + "; ".join(failures) + f" (console: {console})")
            else:
                passed += 1
                log(f"PASS {name}: {figures}")
    log(f"{tier}: {passed} passed, {failed} failed in {time.time() - t0:.0f}s")
    return failed
