"""The real-model study's paired loop (studies/realmodel/loop.py): its sampler draws exactly from the
policy, two methods at one seed sample token-identical step-1 rollouts and another seed does not, a
rerun repeats itself, and the study's statistics (sign test, interval, stopping rule) are right.

The model is the learning study's committed tiny Qwen2 (studies/learn/checkpoint): a real
transformers model with a real tokenizer and chat template, no download."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies" / "realmodel"))
import loop  # noqa: E402

MODEL = ROOT / "studies" / "learn" / "checkpoint"


def test_inverse_cdf_draws_from_the_softmax():
    """Frequencies of 40,000 draws against softmax(scores): Pearson's chi-square over 5 tokens (4 degrees of
    freedom) stays under 33.4, its 1e-6 quantile; a sampler off by a token or by a temperature is far above."""
    scores = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0]])
    probs = torch.softmax(scores.double(), -1)[0]
    n = 40_000
    uniforms = torch.rand(n, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampler = loop.InverseCDF(uniforms, prompt_width=3)
    out = sampler(torch.zeros(n, 3, dtype=torch.long), scores.expand(n, 5).clone())
    tokens = out.argmax(-1)
    assert torch.isfinite(out).sum(-1).eq(1).all()  # only the drawn token is left finite
    counts = torch.bincount(tokens, minlength=5).double()
    chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum().item()
    assert chi2 < 33.4, (chi2, counts.tolist(), (n * probs).tolist())


def test_inverse_cdf_edges():
    """u = 0 draws the first token with probability > 0, u -> 1 the last; a token at -inf is never drawn,
    whatever u falls on its (empty) interval."""
    scores = torch.tensor([[-math.inf, 0.0, -math.inf, 0.0, -math.inf]])
    cdf_mid = 0.5  # the boundary between tokens 1 and 3
    uniforms = torch.tensor([[0.0], [cdf_mid - 1e-12], [cdf_mid], [1.0 - 1e-16]], dtype=torch.float64)
    sampler = loop.InverseCDF(uniforms, prompt_width=1)
    tokens = sampler(torch.zeros(4, 1, dtype=torch.long), scores.expand(4, 5).clone()).argmax(-1).tolist()
    assert tokens == [1, 1, 3, 3]


def test_uniforms_are_a_function_of_seed_and_step():
    a = loop.step_uniforms(3, 1, 8, 5)
    assert torch.equal(a, loop.step_uniforms(3, 1, 8, 5))
    assert not torch.equal(a, loop.step_uniforms(3, 2, 8, 5))
    assert not torch.equal(a, loop.step_uniforms(4, 1, 8, 5))
    assert not torch.equal(a, loop.step_uniforms(3, 1, 8, 5, purpose="eval"))


def _task() -> loop.Task:
    train = [{"prompt": f"What is {i} plus {i + 1}?", "label": str(2 * i + 1)} for i in range(12)]

    def reward(queries: list[str], prompts: list[str], labels: list[str]) -> list[float]:
        # any deterministic function of the reply serves here: an even number of characters
        return [float(len(q[len(p) :]) % 2 == 0) for q, p in zip(queries, prompts)]

    return loop.Task(train, [], reward)


def _cfg(steps: int) -> loop.LoopConfig:
    return loop.LoopConfig(steps=steps, prompts=2, samples=4, minibatches=2, max_new_tokens=8, threads=1)


@pytest.fixture(scope="module")
def task() -> loop.Task:
    return _task()


def _replies(method: str, seed: int, steps: int, task: loop.Task) -> list[str]:
    result = loop.run(MODEL, task, method, seed, _cfg(steps))
    return [s["replies_sha"] for s in result["steps"]]


def test_step1_rollouts_are_token_identical_across_methods_and_differ_across_seeds(task):
    clip = _replies("clip", 0, 1, task)
    band = _replies("band-kl", 0, 1, task)
    other_seed = _replies("clip", 1, 1, task)
    assert clip == band
    assert clip != other_seed


def test_a_rerun_repeats_itself(task):
    """Two steps of one method at one seed, twice: the same step-2 replies (drawn after an update) and the
    same weights at the end, bit for bit."""
    first = loop.run(MODEL, task, "band-kl", 5, _cfg(2), eval_rows=[])
    second = loop.run(MODEL, task, "band-kl", 5, _cfg(2), eval_rows=[])
    assert [s["replies_sha"] for s in first["steps"]] == [s["replies_sha"] for s in second["steps"]]
    assert [s["clip_frac"] for s in first["steps"]] == [s["clip_frac"] for s in second["steps"]]


def test_replies_stop_at_the_end_token_and_pack_into_openrlhfs_layout():
    policy = loop.Policy(MODEL, threads=1)
    prompts = [policy.encode(policy.prompt_text({"prompt": "What is 1 plus 2?"}))] * 3
    uniforms = loop.step_uniforms(0, 1, 3, 6)
    replies = loop.generate_replies(policy.model, prompts, uniforms, 6, policy.eos_ids, policy.pad_id)
    for r in replies:
        assert 1 <= len(r) <= 6
        assert all(t not in policy.eos_ids for t in r[:-1])
    width = max(map(len, replies))
    sequences, attention, action = loop.pack(prompts, replies, policy.pad_id, width)
    assert action.sum(-1).tolist() == [float(len(r)) for r in replies]
    assert sequences[:, -width:][action.bool()].tolist() == [t for r in replies for t in r]
    # the log-probs of the drawn tokens come from the same distribution the sampler drew from
    lp = policy.log_probs(sequences, attention, action)
    assert torch.isfinite(lp[action.bool()]).all()


def test_group_advantages_match_openrlhfs_group_norm():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = loop.group_advantages(rewards, 4)
    r = rewards.reshape(2, 4)
    assert torch.allclose(adv, ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1))
    assert adv[4:].eq(0).all()  # a group without variance carries no gradient


def test_sign_test_interval_and_stopping_rule():
    import study

    assert study.sign_test([1.0] * 8) == {"positive": 8, "n": 8, "p_two_sided": 2 / 256}
    assert study.sign_test([1.0, -1.0, 0.0, float("nan")])["n"] == 2
    assert study.sign_test([1, 1, 1, 1, 1, 1, -1, -1])["p_two_sided"] == pytest.approx(2 * 37 / 256)
    iv = study.interval([0.1, 0.3])
    assert iv["ci95"] == pytest.approx([0.2 - 12.706 * 0.1, 0.2 + 12.706 * 0.1])
    base = {"clip_rises": [0.1] * 4}
    assert study.stopping_rule({"n": 3, "ci95": [0.01, 0.02], **base}) is None  # never before 4 pairs
    assert "excludes 0" in study.stopping_rule({"n": 4, "ci95": [0.01, 0.2], **base})
    assert "half-width" in study.stopping_rule({"n": 4, "ci95": [-0.01, 0.02], **base})
    assert study.stopping_rule({"n": 4, "ci95": [-0.05, 0.05], **base}) is None
    assert study.stopping_rule({"n": 12, "ci95": [-0.5, 0.5], **base}) == "12 pairs"
    # the ledger compares settings read back from JSON: what settings() returns must survive the trip
    assert study.settings() == json.loads(json.dumps(study.settings()))


def test_the_sampler_inside_generate_matches_teacher_forced_probabilities():
    """Ground truth for both halves of the loop: 4,000 replies (4 tokens) of one prompt, drawn through
    `generate` with the KV cache and left padding (a longer prompt pads this one), against the
    teacher-forced probability (OpenRLHF's Actor) of the three most frequent replies. Each frequency
    lies within 5 binomial standard errors of its probability; a sampler at temperature 1.3 misses the
    first by 8 of them (tried)."""
    policy = loop.Policy(MODEL, threads=1)
    short = policy.encode(policy.prompt_text({"prompt": "What is 1 plus 2?"}))
    long = policy.encode(policy.prompt_text({"prompt": "What is 12 plus 25 and then 3 more?"}))
    n = 4000
    prompts = [long] + [short] * n
    uniforms = loop.step_uniforms(11, 1, len(prompts), 4)
    replies = loop.generate_replies(policy.model, prompts, uniforms, 4, policy.eos_ids, policy.pad_id, batch_rows=512)
    counts: dict[tuple[int, ...], int] = {}
    for r in replies[1:]:
        counts[tuple(r)] = counts.get(tuple(r), 0) + 1
    top = sorted(counts, key=counts.get, reverse=True)[:3]
    width = max(map(len, top))
    sequences, attention, action = loop.pack([short] * len(top), [list(t) for t in top], policy.pad_id, width)
    p = (policy.log_probs(sequences, attention, action) * action).sum(-1).exp().tolist()
    for reply, prob in zip(top, p):
        freq = counts[reply] / n
        se = math.sqrt(prob * (1 - prob) / n)
        assert abs(freq - prob) < 5 * se, (reply, freq, prob, se)


def _few_shot_prompts(policy: loop.Policy, n: int) -> list[list[int]]:
    """n chat prompts that share two solved turns (a task's shots) and differ in their last question, of several
    lengths (so the rows' own parts are left-padded)."""
    shots = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "<answer>5</answer>"}]
    questions = [f"What is {i} plus {7 * i}?" if i % 2 else f"What is {i}?" for i in range(n)]
    return [policy.encode(policy.prompt_text({"prompt": [*shots, {"role": "user", "content": q}]})) for q in questions]


def test_the_shared_prefix_path_gives_the_actors_replies_log_probs_entropies_and_gradients():
    """The shared prefix (loop.Policy(shared_prefix=True): the few-shot turns run once a pass, their keys and
    values shared) against OpenRLHF's Actor and Hugging Face's generate on whole sequences: the same sampled and
    greedy replies token for token; log-probs and entropies within 1e-4 nats and parameter gradients within 1e-4
    of their largest entry. float32 rounding through this 2-layer, 128-wide model moves a logit by ~5e-6 (the
    prefix's GEMMs run on one row instead of N: another summation order); a position off by one, a mask that
    hides or shows a wrong key or a prefix from another prompt moves log-probs by > 1e-2 (the last is checked)."""
    whole, shared = loop.Policy(MODEL, threads=1), loop.Policy(MODEL, threads=1, shared_prefix=True)
    prompts = _few_shot_prompts(whole, 6)
    length = loop.shared_prefix_length(prompts)
    assert 0 < length < min(map(len, prompts)) and len({len(p) for p in prompts}) > 1
    uniforms = loop.step_uniforms(3, 1, len(prompts), 8)
    replies = loop.generate_replies(whole.model, prompts, uniforms, 8, whole.eos_ids, whole.pad_id)
    assert shared.generate(prompts, uniforms, 8) == replies
    greedy = loop.generate_replies(whole.model, prompts, None, 8, whole.eos_ids, whole.pad_id)
    assert shared.generate(prompts, None, 8) == greedy

    a, b = whole.pack(prompts, replies), shared.pack(prompts, replies)
    assert not a.prefix and b.prefix == prompts[0][:length]
    assert torch.equal(a.action, b.action)
    lp_a, ent_a = whole.packed_log_probs(a, entropy=True)
    lp_b, ent_b = shared.packed_log_probs(b, entropy=True)
    live = a.action.bool()
    assert (lp_a - lp_b)[live].abs().max() < 1e-4
    assert (ent_a - ent_b)[live].abs().max() < 1e-4
    # the same function is differentiated: every parameter's gradient of the summed log-probs
    for policy, batch in ((whole, a), (shared, b)):
        policy.model.zero_grad()
        policy.forward(batch)[0].sum().backward()
    for (name, p), q in zip(whole.model.named_parameters(), shared.model.parameters()):
        assert (p.grad - q.grad).abs().max() <= 1e-4 * p.grad.abs().max(), name
    # a prefix that is not the rows' own (one token dropped) is seen
    wrong = loop.Packed(b.sequences, b.attention, b.action, b.prefix[1:])
    assert (shared.packed_log_probs(wrong) - lp_b)[live].abs().max() > 1e-2


def test_step1_rollouts_are_identical_across_the_entropy_studys_arms_with_the_shared_prefix():
    """Exact pairing in the entropy study's setting (the shared prefix on): every arm and probe arm samples the
    same step-1 replies at one seed, and another seed does not."""
    import entropy_study

    policy = loop.Policy(MODEL, threads=1)
    shots = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "<answer>5</answer>"}]
    train = [
        {"prompt": [*shots, {"role": "user", "content": f"What is {i} plus {i + 1}?"}], "label": ""} for i in range(8)
    ]
    base = _task()
    task = loop.Task(train, [], base.reward_fn)
    assert loop.shared_prefix_length([policy.encode(policy.prompt_text(r)) for r in train]) > 0

    def first_step(method: str, seed: int) -> str:
        return loop.run(MODEL, task, method, seed, _cfg(1), shared_prefix=True)["steps"][0]["replies_sha"]

    arms = (*entropy_study.ARMS, *entropy_study.PROBE_EXTRA)
    shas = {arm: first_step(arm, 0) for arm in arms}
    assert len(set(shas.values())) == 1, shas
    assert first_step("clip", 1) != shas["clip"]


def test_replay_updates_each_method_from_the_same_weights_and_restores_them(task):
    """The replay probe's step (loop.replay, both studies' probes): each method's update starts from `weights`
    (a method run twice gives the same numbers, bit for bit, wherever it sits in the list) and the policy holds
    `weights` again after."""
    policy = loop.Policy(MODEL, threads=1)
    cfg = _cfg(1)
    weights = policy.state()
    rows = loop.step_prompts(task, 0, 1, cfg.prompts)
    uniforms = loop.step_uniforms(0, 1, cfg.prompts * cfg.samples, cfg.max_new_tokens)
    rollout = loop.make_rollout(policy, task, rows, cfg.samples, uniforms, cfg.max_new_tokens)
    eval_rows = [{"prompt": "What is 1 plus 2?", "label": json.dumps({"entry": {"answer": "3"}})}]
    out = loop.replay(policy, weights, rollout, ["clip", "band-kl"], cfg, 7, eval_rows)
    again = loop.replay(policy, weights, rollout, ["band-kl"], cfg, 7, eval_rows)
    assert out["band-kl"]["after"] == again["band-kl"]["after"]
    assert out["band-kl"]["clip_frac"] == again["band-kl"]["clip_frac"]
    assert all(torch.equal(v, weights[k]) for k, v in policy.model.state_dict().items())
