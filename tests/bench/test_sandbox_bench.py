"""`openrlhf-band bench code-sandbox` runs its providers side by side on HumanEval's canonical programs: each
sandboxed provider must pass all 164 (a sandbox that fails correct programs is not measured, it is broken), and
the report names the interpreter and the machine."""

from __future__ import annotations

import os

import pytest

from openrlhf_band import sandbox
from openrlhf_band.bench import sandbox_bench


def test_one_round_of_the_benchmark_passes_every_program_in_each_provider():
    result = sandbox_bench.run(threads=2, rounds=1, providers=("unsandboxed", "namespaces", "rlimits"))
    rows = {row["provider"]: row for row in result["rows"]}
    assert set(rows) == {"unsandboxed", "namespaces", "rlimits"}
    assert all(row["passed"] == [164] for row in rows.values()), rows
    assert rows["unsandboxed"]["ratio_to_unsandboxed_median"] == 1.0
    assert result["python"] == sandbox.interpreter() and result["machine"]["kernel"] == os.uname().release
    assert "unsandboxed" in sandbox_bench.format_report(result)


def test_bubblewraps_root_is_the_harnesss_layout():
    """The bubblewrap provider builds the root the harness's isolate() builds: each system directory bound read-only
    (or its symlink), the /etc files, the device nodes, sized tmpfs for /tmp and /dev/shm, a read-only root, no
    nested user namespace."""
    from openrlhf_band.sandbox import harness

    setup = {"limits": sandbox.Limits().for_harness()}
    args = sandbox_bench.bubblewrap_arguments(setup, sandbox.interpreter_prefixes(sandbox.interpreter()))
    pairs = {(args[i], args[i + 2]) for i in range(len(args) - 2)}
    for path in harness.SYSTEM_DIRS:
        if os.path.islink(path):
            assert ("--symlink", path) in pairs
        elif os.path.isdir(path):
            assert ("--ro-bind", path) in pairs
    assert all(("--ro-bind-try", path) in pairs for path in harness.ETC_FILES)
    assert all(("--dev-bind", f"/dev/{node}") in pairs for node in harness.DEV_NODES)
    scratch = str(setup["limits"]["scratch_bytes"])
    assert ["--size", scratch, "--tmpfs", "/tmp"] == args[args.index("/tmp") - 3 : args.index("/tmp") + 1]
    assert {"--disable-userns", "--unshare-all", "--die-with-parent"} <= set(args)
    assert args[args.index("--remount-ro", args.index("--proc")) + 1] == "/"


@pytest.mark.skipif(sandbox_bench.bubblewrap() is None, reason="no bwrap: install it or set OPENRLHF_BAND_BWRAP")
def test_bubblewrap_runs_the_same_harness():
    sandbox.RUNNERS["bubblewrap"] = sandbox_bench.bubblewrap_runner(sandbox_bench.bubblewrap())
    test = {"test": "assert f() == 1\n"}
    try:
        assert sandbox.run_tests("def f():\n    return 1\n", test, "f", mode="bubblewrap").passed
        assert not sandbox.run_tests("def f():\n    return 2\n", test, "f", mode="bubblewrap").passed
    finally:
        del sandbox.RUNNERS["bubblewrap"]
