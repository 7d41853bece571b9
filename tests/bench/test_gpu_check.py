"""bench/gpu_check.sh, the one-call GPU check, on this CPU before any device runs it.

- Its step limits add up to at most 540 s (9 minutes) by construction, and no command escapes them.
- `--dry-run` runs every step at tiny sizes (Triton's interpreter, the torch path) and writes exactly the
  two files a real run writes (the summary JSON, the details archive), each step with a status.
- On a Python without torch every torch step is skipped, said so, and the summary is still written;
  a real run that could not check correctness exits 3.
- gpu_check.py's correctness path (check_case, the offsets check) runs in the interpreter: every
  divergence passes, and a reference off by 1e-3 at one token is caught.
- OPENRLHF_BAND_TEST_DEVICE=cuda is read: without a device the kernel test modules skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
LIMIT_S = 540
MAX_FILES = 8


def step_limits(script: str) -> dict[str, int]:
    """Each `run_step NAME LIMIT` of the script (the only way it runs a step)."""
    return {name: int(limit) for name, limit in re.findall(r"^run_step (\S+) (\d+) ", script, re.M)}


def limits_problems(script: str) -> list[str]:
    problems = []
    limits = step_limits(script)
    if sum(limits.values()) > LIMIT_S:
        problems.append(f"step limits add up to {sum(limits.values())} s > {LIMIT_S} s: {limits}")
    # `timeout` only inside run_step, which ends a step 5 s before its limit and kills it at the limit
    calls = [line.strip() for line in script.splitlines() if re.search(r"\btimeout\b", line.split("#")[0])]
    if calls != ['timeout --kill-after=5 "$((limit - 5))" "$@" > "$WORK/$name.log" 2>&1']:
        problems.append(f"timeout used outside run_step's one call: {calls}")
    return problems


def test_step_limits_add_up_to_nine_minutes():
    script = SCRIPT.read_text()
    steps = {"preflight", "correctness", "speed", "contract", "logprobs", "bounds", "summary"}
    assert set(step_limits(script)) == steps
    assert limits_problems(script) == []


def test_the_limit_check_can_fail():
    script = SCRIPT.read_text()
    assert limits_problems(script.replace("run_step bounds 25 ", "run_step bounds 26 "))
    assert limits_problems(script.replace('"$((limit - 5))"', '"$limit"'))
    assert limits_problems(script + "\ntimeout 60 python3 -c pass\n")


def run_check(tmp_path: Path, python: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENRLHF_BAND_TEST_DEVICE", "PYTHONPATH")}
    env.update(OUT=str(out), PYTHON=python)
    proc = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    return proc, out


def read_summary(out: Path) -> dict:
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check_details.tar.gz", "gpu_check_summary.json"] and len(files) <= MAX_FILES
    return json.loads((out / "gpu_check_summary.json").read_text())


def test_dry_run_runs_every_step_and_writes_two_files(tmp_path):
    proc, out = run_check(tmp_path, sys.executable, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = read_summary(out)
    status = {s["name"]: s["status"] for s in summary["steps"]}
    assert status == {"preflight": "PASS", "correctness": "PASS", "speed": "NOT_JUDGED", "contract": "PASS",
                      "logprobs": "MEASURED", "bounds": "MEASURED"}, summary  # fmt: skip
    assert summary["verdict"] == "PASS" and summary["exit_status"] == 0 and summary["dry_run"] is True
    assert summary["machine"]["versions"]["torch"] == torch.__version__
    steps = {s["name"]: s for s in summary["steps"]}
    assert all(s["seconds"] <= s["limit_s"] for s in summary["steps"])
    correctness = steps["correctness"]["figures"]["correctness.json"]
    assert correctness["failures"] == 0 and len(correctness["cases"]) >= 11
    assert correctness["offsets"]["verdict"] == "PASS"
    speed = steps["speed"]["figures"]["speed.json"]
    assert speed["checks"] and all(c["verdict"] == "NOT_JUDGED" for c in speed["checks"])
    assert steps["contract"]["counts"] == {"PASSED": 2}
    with tarfile.open(out / "gpu_check_details.tar.gz") as archive:
        names = archive.getnames()
    assert "gpu_check_details/correctness.log" in names and "gpu_check_details/speed/speed.json" in names


def test_without_torch_steps_are_skipped_and_said_so(tmp_path):
    """`python -S`: no site-packages, so torch and Triton are missing; the summary is still written."""
    wrapper = tmp_path / "python-without-site"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    proc, out = run_check(tmp_path, str(wrapper), "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = read_summary(out)
    assert summary["verdict"] == "PASS (skipped: correctness, speed, contract, logprobs, bounds)"
    steps = {s["name"]: s for s in summary["steps"]}
    for name in ("correctness", "speed", "contract", "logprobs", "bounds"):
        assert steps[name]["status"] == "SKIPPED" and "torch" in steps[name]["skipped"], steps[name]
    assert "SKIPPED: missing torch" in proc.stdout
    proc, out = run_check(tmp_path, str(wrapper))  # a real run that checked nothing
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert read_summary(out)["verdict"].startswith("NOT CHECKED")


@pytest.fixture(scope="module")
def gpu_check_module():
    os.environ["TRITON_INTERPRET"] = "1"
    from kernel_device import kernel_module

    kernel_module()  # interpreted, whatever imported it before
    import openrlhf_band.bench.gpu_check as gpu_check

    return gpu_check


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_check_case_passes_for_every_divergence_in_the_interpreter(gpu_check_module):
    for divergence in gpu_check_module.DIVERGENCES:
        for options in gpu_check_module.option_sets():
            problems = gpu_check_module.check_case(divergence, torch.float32, shape=(2, 70), device="cpu", **options)
            assert problems == [], (divergence, options)


def test_check_case_catches_a_reference_off_at_one_token(gpu_check_module, monkeypatch):
    real = gpu_check_module.band_token_loss

    def off_by_a_little(*args, backend, **kwargs):
        out = real(*args, backend=backend, **kwargs)
        if backend == "torch":
            nudge = torch.zeros_like(out.loss)
            nudge[0, 5] = 1e-3
            out = out._replace(loss=out.loss + nudge)
        return out

    monkeypatch.setattr(gpu_check_module, "band_token_loss", off_by_a_little)
    problems = gpu_check_module.check_case("kl", torch.float32, None, None, None, (2, 70), False, device="cpu")
    assert problems and problems[0].startswith("loss: max abs diff 1.0")


def test_offsets_check_runs_and_can_fail(gpu_check_module, monkeypatch):
    assert gpu_check_module.check_offsets(3000, "cpu", window=256)["verdict"] == "PASS"
    real = gpu_check_module.band_token_loss

    def wrong_far_out(*args, backend, **kwargs):  # the kernel wrong beyond the first window only
        out = real(*args, backend=backend, **kwargs)
        if backend == "triton":
            out = out._replace(loss=out.loss + (torch.arange(out.loss.shape[-1]) > 1000))
        return out

    monkeypatch.setattr(gpu_check_module, "band_token_loss", wrong_far_out)
    report = gpu_check_module.check_offsets(3000, "cpu", window=256)
    assert report["verdict"] == "FAIL" and "start" not in " ".join(report["problems"])


def test_the_device_switch_is_read(tmp_path):
    """OPENRLHF_BAND_TEST_DEVICE=cuda without a device: the kernel test modules skip, saying why."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the switch would run the tests there")
    env = {**os.environ, "OPENRLHF_BAND_TEST_DEVICE": "cuda"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "--import-mode=importlib", "-rs",
         "tests/ops/test_band_loss_kernel.py", "tests/ops/test_differential.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 5 or "2 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "OPENRLHF_BAND_TEST_DEVICE=cuda but torch sees no CUDA device" in proc.stdout
