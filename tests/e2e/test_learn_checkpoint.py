"""The learning test's warm-up checkpoint is committed (studies/learn/checkpoint/) instead of made in every
suite: OpenRLHF's train_sft takes 5 min on 2 cores with native bf16 and 17 on one without. These tests
hold the committed files to their record (MADE.json: the command, the task version, the weights' digest,
the held-out numbers), the record to the study that started from it, and, when asked
(`make learn-checkpoint-rebuild`: E2E_REBUILD_CHECKPOINT=1), the command to the committed numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "studies" / "learn"
CHECKPOINT = LEARN / "checkpoint"
MADE = json.loads((CHECKPOINT / "MADE.json").read_text())
HELD_OUT = ("mean_reward", "p_correct", "p_fork_hard", "entropy")
# A rebuilt checkpoint's held-out numbers within these of the committed ones keeps the learning test what it
# is: it asks for a rise of more than the study's seed spread (0.102) and the study's 15 runs rose by 0.156 or
# more from this checkpoint, so a starting point 0.01 higher in exact P(correct) (0.03 in the sampled
# exact-match rate, 4.7 sd of its 128 x 16-sample mean at 0.09) leaves more than half of that margin. On the
# machine that made it the rebuild is equal (one rank, fixed seeds: seen, docs/learn_study.md); on another CPU
# kind train_sft's bf16 arithmetic differs, and so do the weights.
REBUILD_BOUND = {"mean_reward": 0.03, "p_correct": 0.01, "p_fork_hard": 0.01, "entropy": 0.03}


def task_version() -> str:
    text = (LEARN / "learn_task.py").read_text()
    return re.search(r'^TASK_VERSION = "(.*)"$', text, re.M).group(1)


def test_the_committed_checkpoint_is_the_one_its_record_describes():
    assert MADE["task_version"] == task_version(), "learn_task.py changed: make learn-checkpoint-rebuild"
    for name, digest in MADE["sha256"].items():
        assert hashlib.sha256((CHECKPOINT / name).read_bytes()).hexdigest() == digest, name
    assert (CHECKPOINT / "model.safetensors").stat().st_size < 2 * 2**20
    assert "train_sft" in MADE["command"] and MADE["heldout"]["samples_per_prompt"] == 16


def test_the_study_started_from_the_same_commands_checkpoint():
    """The learning study (studies/learn/results/) started from a build of the same command on another CPU (its
    summary printed that checkpoint's held-out numbers); the committed build is within the rebuild bound of it
    (train_sft's bf16 arithmetic differs between CPU kinds, so the weights do)."""
    lines = (LEARN / "results" / "summary.txt").read_text().splitlines()
    line = next(ln for ln in lines if ln.startswith("checkpoint"))
    printed = {name: float(value) for name, value in re.findall(r"(\w+) (\d\.\d{3})", line)}
    assert set(printed) == set(HELD_OUT), line
    for name, bound in REBUILD_BOUND.items():  # + half the last printed digit
        assert abs(MADE["heldout"][name] - printed[name]) <= bound + 0.0005, (name, MADE["heldout"][name], line)


@pytest.mark.skipif(
    os.environ.get("E2E_REBUILD_CHECKPOINT") != "1",
    reason="makes the checkpoint again with train_sft (5-17 min): make learn-checkpoint-rebuild",
)
def test_the_warmup_command_reproduces_the_committed_checkpoint(tmp_path):
    out = tmp_path / "learn"
    proc = subprocess.run(
        ["bash", str(LEARN / "warmup.sh"), str(out)], env={**os.environ, "LEARN_REBUILD": "1"},
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = json.loads((out / "checkpoint_eval.json").read_text())
    differences = {name: rebuilt[name] - MADE["heldout"][name] for name in HELD_OUT}
    digest = hashlib.sha256((out / "checkpoint" / "model.safetensors").read_bytes()).hexdigest()
    same = digest == MADE["sha256"]["model.safetensors"]
    print(f"\nrebuilt - committed: {differences}; weights {'equal' if same else 'differ'}")
    for name, bound in REBUILD_BOUND.items():
        assert abs(differences[name]) <= bound, (name, rebuilt[name], MADE["heldout"][name], bound)
