"""The tasks do what they did before they moved into folders (4f63a9a), on fixed inputs.

tests/fixtures/unchanged/tasks_at_4f63a9a.json is tests/support/unchanged_capture.py's output at that commit:
prepare-data's train.jsonl and eval.jsonl (sha256) and manifest for fixed seeds (math, reasoning-gym with options
and with shots, code, mc, from the fixtures and offline generation), and each task's reward file, loaded by path
as OpenRLHF loads it, on 199 fixed samples (right, wrong, missing, placeholder answers; HumanEval's canonical
solutions and broken ones; nine hostile programs: a busy loop, a fork loop, 8 GiB, an early exit, /etc/shadow, a
connection, a patched AssertionError, a kill of the parent). The only expected difference is the manifest's
`reward_file`, the reward module's name, which moved with it. (Every example script's check-args JSON is held to
check_args_at_4f63a9a.json by tests/launcher/test_examples.py, which runs them anyway.)
"""

from __future__ import annotations

import json
from pathlib import Path

from unchanged_capture import capture

from openrlhf_band import tasks

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "unchanged" / "tasks_at_4f63a9a.json"
BEFORE = json.loads(FIXTURE.read_text())
CASE_TASK = {"math": "math", "reasoning-gym": "reasoning-gym", "reasoning-gym-shots": "reasoning-gym", "code": "code",
             "mc": "mc"}  # fmt: skip


def test_prepared_data_and_rewards_are_those_before_the_restructure():
    now = capture()
    for case, before in BEFORE["prepare"].items():
        old_module = before["reward_module"]
        assert old_module.startswith("openrlhf_band.recipe.")  # the name at 4f63a9a
        after = dict(now["prepare"][case])
        assert after.pop("reward_module") == tasks.TASKS[CASE_TASK[case]].reward_module
        assert after == {k: v for k, v in before.items() if k != "reward_module"}, case
    assert now["rewards"] == BEFORE["rewards"]
