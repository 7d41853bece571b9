"""`--actor.band.anchor rollout` through OpenRLHF 0.11.2's own experience maker (the patched
`RemoteExperienceMaker.make_experience`): pi_old is vLLM's log-probs and the actor's recompute pass is never
dispatched; with the default anchor the pass runs and its result is pi_old, as in the released code. Ray's
object store is replaced by the identity (ray.put / ray.get) so the real method runs in this process; the
end-to-end run (tests/e2e, the floor run) counts the actor's forward calls through the real Ray cluster.

Also the loss's side: with the anchor, the band's behaviour metrics read exactly 0 and band/anchor_rollout 1."""

from __future__ import annotations

import types

import pytest
import torch

from openrlhf_band.integration import BandPolicyLoss
from openrlhf_band.patching.check_args import validate_train_args

BASE = [
    "--actor.model_name_or_path", "some/model", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "2", "--reward.remote_url", "reward.py", "--algo.kl.init_coef", "0",
]  # fmt: skip


class ActorGroup:
    """The actor's RayActorGroup as the experience maker uses it: the forward it dispatches returns, per micro-batch,
    log-probs that differ from vLLM's (so a test sees which one became pi_old)."""

    def __init__(self):
        self.forwards = 0

    def async_run_method_batch(self, method_name, **kwargs):
        assert method_name == "forward"
        self.forwards += 1
        return [[mask.float() * -0.25] for mask in kwargs["action_mask"]]  # one rank's results, one per batch

    def async_run_method(self, method_name):
        return None


def micro_batches(seed: int = 0, batches: int = 3):
    """OpenRLHF Experience micro-batches as the samples generator makes them: prompt + reply, the action mask
    shifted by one, vLLM's log-probs at the reply's positions and 0.0 elsewhere, a precomputed reward."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        sequences = torch.randint(0, 100, (2, 9), generator=g)
        action_mask = torch.zeros(2, 8, dtype=torch.long)
        action_mask[:, 3:] = 1
        action_mask[1, 6:] = 0  # a shorter reply
        rollout = torch.where(action_mask.bool(), -torch.rand(2, 8, generator=g) * 5, 0.0)
        out.append(Experience(sequences=sequences, attention_mask=torch.ones_like(sequences), action_mask=action_mask,
                              rollout_log_probs=rollout, rewards=torch.rand(2, generator=g)))  # fmt: skip
    return out


@pytest.fixture
def maker(monkeypatch):
    import ray
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(ray, "get", lambda refs: refs)

    def make(*flags: str) -> RemoteExperienceMaker:
        args = validate_train_args([*BASE, *flags])
        strategy = types.SimpleNamespace(args=args)
        return RemoteExperienceMaker(ActorGroup(), None, None, None, None, strategy, tokenizer=None)

    return make


def test_the_patched_experience_maker_takes_pi_old_from_vllm_and_skips_the_recompute(maker):
    anchored = maker("--loss", "band", "--actor.band.anchor", "rollout")
    samples = micro_batches()
    expected = [s.rollout_log_probs.clone() for s in samples]
    made = anchored.make_experience(samples)
    assert anchored.actor_model_group.forwards == 0
    for s, want in zip(made, expected):
        assert s.action_log_probs.dtype == torch.float32
        assert torch.equal(s.action_log_probs, want) and torch.equal(s.rollout_log_probs, want)


@pytest.mark.parametrize("flags", [("--loss", "band"), ("--loss", "sapo"), ()])
def test_without_the_anchor_the_recompute_pass_is_pi_old_as_released(maker, flags):
    recomputed = maker(*flags)
    samples = micro_batches()
    made = recomputed.make_experience(samples)
    assert recomputed.actor_model_group.forwards == 1
    for s in made:
        assert torch.equal(s.action_log_probs, s.action_mask.float() * -0.25)


def test_ring_attention_or_tensor_parallel_copies_keep_one_entry_per_micro_batch(maker):
    from openrlhf_band.integration.hooks import rollout_anchor_ref

    args = validate_train_args([*BASE, "--loss", "band", "--actor.band.anchor", "rollout"])
    samples = micro_batches(batches=2)
    ref = rollout_anchor_ref(args, samples, duplicate_factor=4)
    assert len(ref) == 8
    flat = maker("--loss", "band")._flatten_results(ref, 4)  # OpenRLHF's own de-duplication
    assert [torch.equal(a, s.rollout_log_probs) for a, s in zip(flat, samples)] == [True, True] and len(flat) == 2


@pytest.mark.parametrize(
    "damage, message",
    [("none", "came back without vLLM's log-probs"), ("nan", r"1 sampled token\(s\) have a non-finite vLLM log-prob"),
     ("shape", "do not match the action mask")],
)  # fmt: skip
def test_a_sample_the_band_cannot_be_centred_on_stops_the_step_with_the_reason(maker, damage, message):
    samples = micro_batches()
    if damage == "none":
        samples[1].rollout_log_probs = None
    elif damage == "nan":
        samples[2].rollout_log_probs[0, 4] = float("nan")
    else:
        samples[0].rollout_log_probs = samples[0].rollout_log_probs[:, 1:]
    with pytest.raises(RuntimeError, match=message):
        maker("--loss", "band", "--actor.band.anchor", "rollout").make_experience(samples)


def test_garbage_outside_the_action_mask_is_no_reason_to_stop(maker):
    samples = micro_batches()
    samples[0].rollout_log_probs[1, 7] = float("-inf")  # masked (the shorter reply's padding)
    made = maker("--loss", "band", "--actor.band.anchor", "rollout").make_experience(samples)
    assert torch.isneginf(made[0].action_log_probs[1, 7])


def test_with_the_anchor_the_behaviour_metrics_read_zero_and_the_metrics_say_which_centre():
    g = torch.Generator().manual_seed(1)
    mu = -torch.rand(3, 7, generator=g) * 4
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[2, 5:] = False
    log_probs = (mu + 0.3 * torch.randn(3, 7, generator=g)).requires_grad_()
    advantages = torch.randn(3, 7, generator=g)
    for anchor in ("recomputed", "rollout"):
        loss = BandPolicyLoss(anchor=anchor)
        loss(log_probs, mu, advantages, action_mask=mask, rollout_log_probs=mu)
        metrics = loss.loss_metrics
        assert metrics["band/behaviour_abs_log_ratio"].item() == 0.0
        assert metrics["band/behaviour_outside_frac"].item() == 0.0
        assert ("band/anchor_rollout" in metrics) is (anchor == "rollout")
        if anchor == "rollout":
            assert metrics["band/anchor_rollout"].item() == 1.0
    with pytest.raises(ValueError, match="anchor must be 'recomputed' or 'rollout'"):
        BandPolicyLoss(anchor="sampler")
