"""Every loss path computes what it did before the one loss wrapper (issue 59), bit for bit.

tests/fixtures/unchanged/losses_at_630bce4.json is tests/support/loss_capture.py's output at 630bce4, before the
band, band-CISPO and the objectives moved behind one OpenRLHF `PolicyLoss` wrapper: every `make_policy_loss` case
(the band's rules and options, band-CISPO, each objective, OpenRLHF's ppo) in four aggregation / IS-correction
variants on inputs whose masked positions hold nan and inf (loss, gradient, clip ratio, ppo_kl, IS outputs,
metrics, refusals), each demo method's loss module and bounds, and short demo runs of every demo method plus the
mechanism check. (Every example script's check-args JSON at 630bce4 equals check_args_at_4f63a9a.json, which
tests/launcher/test_examples.py holds them to.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loss_capture import capture  # tests/support

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "unchanged" / "losses_at_630bce4.json"


@pytest.fixture(scope="module")
def now() -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the capture: one thread's summation order
    try:
        return json.loads(json.dumps(capture(), sort_keys=True))
    finally:
        torch.set_num_threads(threads)


BEFORE = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("part", ["modules", "demo_losses", "demo_runs"])
def test_every_loss_path_is_unchanged(now, part):
    before, after = BEFORE[part], now[part]
    added = {"band-kl-rollout", "gpg", "drpo", "ipo"} if part != "modules" else set()  # demo methods since 630bce4
    assert sorted(after) == sorted({*before, *added})
    for case in before:
        assert after[case] == before[case], case
