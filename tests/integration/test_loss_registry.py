"""One loss path: every policy loss is an entry of one registry (integration/loss_registry.py), which the patched
actor's hook and `make_policy_loss` both read, and every module of ours is an `OpenRLHFPolicyLoss`, which alone
owns OpenRLHF's contract (the IS correction, the aggregation, the 5-tuple)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from openrlhf_band.integration.hooks import loss_class_and_kwargs
from openrlhf_band.integration.loss_registry import POLICY_LOSSES, loss_entry
from openrlhf_band.integration.objective_loss import make_policy_loss
from openrlhf_band.integration.openrlhf_loss import OpenRLHFPolicyLoss
from openrlhf_band.patching.check_args import validate_train_args

INTEGRATION = Path(__file__).resolve().parents[2] / "openrlhf_band" / "integration"
BASE = ["--actor.model_name_or_path", "m", "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt",
        "4", "--reward.remote_url", "r.py"]  # fmt: skip


def _flags(key: str) -> list[str]:
    return ["--loss", "cispo", "--actor.cispo.bounds", "band"] if key == "band-cispo" else ["--loss", key]


@pytest.mark.parametrize("key", list(POLICY_LOSSES))
def test_the_actor_and_make_policy_loss_build_the_same_module(key):
    from openrlhf.models.loss import PolicyLoss

    args = validate_train_args([*BASE, *_flags(key)])
    cls, kwargs = loss_class_and_kwargs(args, PolicyLoss)
    name, bounds = ("cispo", "band") if key == "band-cispo" else (key, None)
    made = make_policy_loss(name, **({"bounds": bounds} if bounds else {}))
    assert type(made) is cls
    assert loss_entry(name, bounds).key == key
    if POLICY_LOSSES[key].openrlhf:
        assert cls is PolicyLoss and kwargs == {}
    else:
        assert issubclass(cls, OpenRLHFPolicyLoss)
        built = cls(policy_loss_type=name, **kwargs)
        assert built.policy_loss_type == made.policy_loss_type


def test_only_the_base_class_aggregates_and_corrects():
    """OpenRLHF's aggregate_loss and masked_mean and the IS correction's coefficients are called by the base class
    (integration/openrlhf_loss.py) and by no loss: the losses supply their token loss only."""
    callers = {}
    for path in INTEGRATION.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("aggregate_loss", "masked_mean", "coefficients"):
                    callers.setdefault(name, set()).add(path.name)
    assert callers["aggregate_loss"] == {"openrlhf_loss.py"} and callers["coefficients"] == {"openrlhf_loss.py"}
    assert callers["masked_mean"] == {"openrlhf_loss.py", "is_correction.py"}  # (the correction's own vllm_kl)
    for loss_module in ("policy_loss.py", "objective_loss.py"):
        assert all(loss_module not in files for files in callers.values())


def test_an_unknown_loss_says_what_is_registered():
    with pytest.raises(ValueError, match="unknown policy loss 'cispo2'.*registered: ppo, gspo, band, cispo"):
        loss_entry("cispo2")


def test_an_objective_without_an_action_mask_counts_every_token():
    """OpenRLHF's aggregation needs a mask: an objective called without one gets ones, as before the base class."""
    lp, old, adv = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 1)
    for agg in (True, False):
        loss = make_policy_loss("sapo", token_level_loss=agg)
        assert torch.equal(loss(lp, old, adv, None)[0], loss(lp, old, adv, torch.ones(2, 3))[0])


def test_ppo_kl_keeps_each_losss_arithmetic_with_mixed_dtypes():
    """An objective subtracts in the log-probs' dtype (old cast to it), the band in the promoted one, as before."""
    from openrlhf.models.utils import masked_mean

    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(2, 3, generator=g).to(torch.bfloat16), torch.randn(2, 3, generator=g)
    adv, mask = torch.randn(2, 1, generator=g), torch.ones(2, 3)
    objective_kl = make_policy_loss("sapo")(lp, old, adv, mask)[2]
    assert torch.equal(objective_kl, masked_mean(-(lp - old.to(torch.bfloat16)), mask, dim=None))
    band_kl = make_policy_loss("band", backend="torch")(lp, old, adv, mask)[2]
    assert torch.equal(band_kl, masked_mean(-(lp - old), mask, dim=None))
    assert not torch.equal(objective_kl.float(), band_kl.float())  # the two arithmetics differ on these inputs


def test_the_base_refuses_mismatched_shapes_for_every_loss():
    for name in ("band", "sapo"):
        loss = make_policy_loss(name)
        with pytest.raises(ValueError, match="old_log_probs shape"):
            loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 1), torch.ones(2, 3))
