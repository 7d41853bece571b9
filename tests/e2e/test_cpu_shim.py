"""Each patch of the test-only CPU shim (studies/cpu_engine/cpu_shim) is needed: without it the OpenRLHF call
fails on this machine (or, for the weight sync, silently sends nothing), and with it the call works."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "studies" / "cpu_engine"  # the CPU engine harness: train.sh, the shim, its probes
PYTHON = ROOT / ".venv-e2e" / "bin" / "python"


def load_shim():
    spec = importlib.util.spec_from_file_location("e2e_cpu_shim_names", ENGINE / "cpu_shim" / "sitecustomize.py")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    return shim


# test instrumentation, not patches of CUDA-only calls; and the measurement of the suite on a CPU without native
# bf16 (`make ci-no-bf16`: inert unless E2E_EMULATE_NO_BF16=1, shown needed in docs/tests.md#timings)
PROBES = {
    "sync_probe", "loss_calls_probe", "training_batches_probe", "fused_logprobs_probe", "clip_bins_probe",
    "forward_dispatch_probe",
    "avx2_cpu_when_emulating",
}  # fmt: skip
PATCH_NAMES = sorted({name for patches in load_shim().PATCHES.values() for name, _ in patches} - PROBES)


@pytest.fixture(scope="module")
def findings() -> dict:
    if not PYTHON.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT), "e2e-venv"], check=True)
    proc = subprocess.run(
        [str(PYTHON), str(ENGINE / "shim_probes.py")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("patch", PATCH_NAMES)
def test_the_patch_is_needed_and_works(findings, patch):
    assert patch in findings, f"no probe shows that {patch} is needed (studies/cpu_engine/shim_probes.py)"
    found = findings[patch]
    assert found["unpatched_error"], found  # the unpatched call fails here
    assert "Error" not in found["patched"], found


def test_without_the_gloo_group_the_weights_silently_do_not_move(findings):
    found = findings["gloo_weight_sync"]
    assert found["unpatched_error"].startswith("no error, but rank 1 received [0.0, 0.0, 0.0, 0.0]"), found
    assert found["received"] == [0.0, 1.0, 2.0, 3.0]


def test_every_module_given_the_cpu_torch_calls_torch_cuda(findings):
    calls = findings["cuda_on_cpu"]["torch.cuda calls per module"]
    assert calls and all(n > 0 for n in calls.values()), calls
