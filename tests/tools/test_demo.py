"""The CPU demo: a quick run end to end, the mechanism it is built around, its bookkeeping (the
paired differences and the per-bin clip rates) against hand computations, and the lower-floor and
DPPO methods: each runs, the floor's bounds are >= F, DPPO has no cap. Its GRPO loop is task-free: a
tiny random Hugging Face Llama (not the demo's Qwen2) with its own sampling (an end token, padding
after it) and reward runs through it."""

from __future__ import annotations

import argparse
import ast
import copy
import csv
import math
from pathlib import Path

import pytest
import torch

from openrlhf_band import band_bounds
from openrlhf_band.tools import demo
from openrlhf_band.tools.cli import main
from openrlhf_band.tools.demo import loop


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    return out


def test_quick_demo_writes_finite_metrics_and_all_three_files(quick):
    rows = list(csv.DictReader((quick / "metrics.csv").open()))
    assert {r["method"] for r in rows} == {"clip", "band-kl"}
    assert sorted({int(r["step"]) for r in rows}) == [0, 5, 10, 15]  # the warm-up point, then every 5 rollouts
    for r in rows:
        for key in ("mean@32", "mean@32_hard", "pass@32", "pass@32_hard", "entropy"):
            assert math.isfinite(float(r[key])), (key, r)
        assert 0.0 <= float(r["mean@32"]) <= float(r["pass@32"]) <= 1.0
    start = [r for r in rows if r["step"] == "0"]
    # both methods start from the same checkpoint: the same evaluation of the same weights on one machine
    # (one torch thread per run), so the same float, whatever the CPU
    assert start[0]["mean@32"] == start[1]["mean@32"]
    assert (quick / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (quick / "summary.txt").read_text()
    assert "paired differences to clip" in text and "clip rates per old-probability bin" in text
    assert "under the kl band" in text


def _read_rows(path) -> list[dict]:
    """metrics.csv back into the rows format_summary works on (numbers as numbers)."""

    def value(key: str, text: str):
        if key == "method":
            return text
        if key in ("seed", "step"):
            return int(text)
        return float(text) if text else math.nan  # the warm-up row has no clip counts

    return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(path.open())]


def test_the_clip_binds_and_the_band_clips_rare_positive_tokens_less(quick):
    # The regime the demo is built for (seeded, so the same numbers every run): under clip 0.2 most
    # positive-advantage updates of p in [0.01, 0.1) tokens end clipped (0.81 in this run, 0.79 in
    # the full run); the kl band clips far fewer of them (0.51), and its lower bound, which goes to
    # 0 for rare tokens, clips almost none of their negative-advantage updates (clip: 0.36).
    rows = _read_rows(quick / "metrics.csv")
    clip, band = demo.pooled_clip_rates(rows, "clip"), demo.pooled_clip_rates(rows, "band-kl")
    (clip_up, _), (band_up, _) = clip["p0.01-0.1"], band["p0.01-0.1"]
    assert clip_up > 0.6
    assert band_up < clip_up - 0.15
    assert band["p<0.01"][1] < 0.05 < 0.2 < clip["p<0.01"][1]


def test_the_warm_up_leaves_the_fork_token_rare_and_the_rest_easy(quick):
    cfg = demo.DemoConfig(out=str(quick))
    state = torch.load(demo.warm_checkpoint(cfg, 0), weights_only=True)  # the quick run's cached one
    model = demo.build_model(cfg, 0)
    model.load_state_dict(state)
    prompts, hard = demo.sample_prompts(256, cfg, torch.Generator().manual_seed(5))
    m = demo.evaluate(model, prompts, hard, cfg)
    assert m["p_fork_hard"] < 0.2  # rare: where a fixed clip caps the rise at 1.2 p
    assert m["mean@32_hard"] < m["mean@32"] < 0.2


def test_rare_token_rises_to_its_bound_under_clip_and_band(quick):
    cfg = demo.DemoConfig(out=str(quick))
    m = demo.mechanism_check(cfg, torch.load(demo.warm_checkpoint(cfg, 0), weights_only=True))
    assert m["p_old"] < 0.2
    # each rise saturates just past its own bound (steps are small, and the bound stops the gradient)
    assert 1.2 <= m["ratio_clip"] <= 1.2 * 1.06
    assert m["bound_band-kl"] <= m["ratio_band-kl"] <= m["bound_band-kl"] * 1.06
    # and that bound is the kl band's r_up at this p (ground truth: band_bounds is tested against mpmath)
    assert m["bound_band-kl"] == pytest.approx(
        band_bounds(torch.tensor([math.log(m["p_old"])]), "kl", 0.05)[1].item(), rel=1e-3
    )


def test_paired_differences_by_hand():
    rows = [
        {"method": m, "seed": s, "step": t, "x": v}
        for m, s, t, v in [
            ("clip", 0, 10, 1.0), ("clip", 1, 10, 2.0), ("band", 0, 10, 1.5), ("band", 1, 10, 2.1),
            ("clip", 0, 20, 3.0), ("clip", 1, 20, 3.0), ("band", 0, 20, 3.5), ("band", 1, 20, 2.5),
        ]
    ]  # fmt: skip
    mean, sd, n = demo.paired_differences(rows, "band", "x", [10])
    assert n == 2 and mean == pytest.approx(0.3) and sd == pytest.approx(math.sqrt(0.08))
    mean, sd, _ = demo.paired_differences(rows, "band", "x", [10, 20])  # per seed, averaged over the steps
    assert mean == pytest.approx(((0.5 + 0.5) / 2 + (0.1 - 0.5) / 2) / 2)


def test_clip_stats_count_each_bin_and_side_under_the_given_bounds():
    old = torch.log(torch.tensor([[0.005, 0.05, 0.3, 0.9, 0.05, 0.05]]))
    new = old + torch.log(torch.tensor([[3.0, 1.5, 0.5, 1.0, 0.7, 1.1]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    lower, upper = torch.full_like(old, 0.8), torch.full_like(old, 1.2)
    stats = demo.ClipStats()
    stats.add(old, new, adv, mask, lower, upper)
    rates = stats.rates()
    assert rates["clip_up_p<0.01"] == 1.0 and rates["n_pos_p<0.01"] == 1  # r = 3 > 1.2
    assert rates["clip_up_p0.01-0.1"] == 1.0 and rates["n_pos_p0.01-0.1"] == 1  # the masked one is not counted
    assert rates["clip_low_p0.01-0.1"] == 1.0 and rates["n_neg_p0.01-0.1"] == 1  # r = 0.7 < 0.8
    assert rates["clip_low_p0.1-0.5"] == 1.0  # r = 0.5 < 0.8
    assert rates["clip_up_p>=0.5"] == 0.0 and math.isnan(rates["clip_low_p>=0.5"])


NEW_METHODS = ("band-kl-floor", "band-kl-floor-0.5", "band-kl-floor-0.7", "band-kl-floor-0.9",
               "band-kl-entropy-floor", "dppo-tv", "dppo-kl",
               "cispo", "sapo", "gmpo", "clip-cov", "kl-cov", "band-kl-cispo",
               "band-kl-rollout", "gpg", "drpo", "ipo")  # fmt: skip


@pytest.fixture(scope="module")
def warm_state(quick):
    """The quick run's warm-up checkpoint (seed 0): the rare fork token, so the groups have signal."""
    return torch.load(demo.warm_checkpoint(demo.DemoConfig(out=str(quick)), 0), weights_only=True)


@pytest.mark.parametrize("method", NEW_METHODS)
def test_new_methods_run_two_rollouts_from_the_quick_checkpoint(method, warm_state):
    cfg = demo.DemoConfig(rollouts=2, eval_every=1, eval_prompts=64)
    rows = demo.train_method(method, 0, warm_state, cfg)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in demo.REPORTED:
            assert math.isfinite(r[key]), (key, r)
    assert rows[2]["mean@32"] != rows[0]["mean@32"]  # it trained
    spec = demo.METHODS[method]
    # the loss's own metrics land in the rows: the floor's clips, DPPO's truncations
    assert ("floor_frac" in rows[2]) == ("lower_floor" in spec)
    assert ("truncated_frac" in rows[2]) == (spec["kind"] == "dppo")
    for key in ("floor_frac", "truncated_frac"):
        assert key not in rows[2] or 0.0 <= rows[2][key] <= 1.0


def _old_log_probs() -> torch.Tensor:
    """(2, 8) old log-probs from rare to near-certain tokens."""
    p = torch.tensor([[0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 0.95]] * 2)
    return p.log()


@pytest.mark.parametrize("method", [m for m in demo.METHODS if demo.METHODS[m].get("lower_floor")])
def test_floor_methods_lower_bounds_are_at_least_the_floor(method):
    cfg = demo.DemoConfig()
    floor = demo.METHODS[method]["lower_floor"]
    loss_fn = demo.make_loss(method, cfg)
    assert loss_fn.lower_floor == floor
    old = _old_log_probs()
    new = old + torch.log(torch.tensor([[0.45] * 8, [1.05] * 8]))  # row 0 fell below every floor
    adv = torch.tensor([[-1.0], [1.0]])
    extra = {"entropy": torch.full_like(old, 0.5)} if loss_fn.needs_entropy else {}
    loss_fn(new, old, adv, action_mask=torch.ones_like(old), **extra)
    lower, upper = loss_fn.last_bounds  # what ClipStats counts against
    assert (lower >= floor).all()
    band_lower, _ = band_bounds(old, "kl", cfg.delta, upper_cap=cfg.upper_cap)
    if not loss_fn.needs_entropy:  # the constant radius: the band's bounds with the floor, exactly
        # (the same band_bounds call on the same inputs, then a max, which does not round)
        assert torch.equal(lower, band_lower.clamp(min=floor))
        ref_lower, ref_upper = demo.method_bounds(method, cfg)(old)
        assert torch.equal(lower, ref_lower) and torch.equal(upper, ref_upper)
    # the floor is max(r_low, F), not the ablation's F for every token: it keeps the band's own
    # lower bound where that is above F (kl, delta 0.05: r_low > 0.8 for p > 0.751, 0.867 at p = 0.9)
    assert (lower > floor).any() or floor >= 0.9
    assert loss_fn.band_metrics["band/clip_frac_floor"].item() > 0.0  # r = 0.45 is inside the band for rare p


def test_the_kl_floor_numbers_the_comments_quote():
    p = torch.tensor([0.75, 0.7515, 0.9], dtype=torch.float64)
    lower, _ = band_bounds(p.log(), "kl", 0.05)
    assert lower[0] < 0.8 < lower[1] and lower[2].item() == pytest.approx(0.867, abs=5e-4)
    ablation, _ = demo.method_bounds("band-kl+clip-low", demo.DemoConfig())(p.log())
    floored, _ = demo.method_bounds("band-kl-floor", demo.DemoConfig())(p.log())
    assert torch.equal(ablation, torch.full_like(ablation, 0.8)) and floored[2] > 0.86


@pytest.mark.parametrize("method", ["dppo-tv", "dppo-kl"])
def test_dppo_methods_have_no_cap_and_truncate(method):
    spec = demo.METHODS[method]
    loss_fn = demo.make_loss(method, demo.DemoConfig())
    assert loss_fn.upper_cap is None and loss_fn.dual_clip is None
    assert loss_fn.ratio_truncation == 1e4 and loss_fn.delta == loss_fn.lower_delta == spec["delta"]
    old = _old_log_probs()
    loss_fn(old + 0.01, old, torch.ones(2, 1), action_mask=torch.ones_like(old))
    lower, upper = loss_fn.last_bounds
    ref_lower, ref_upper = band_bounds(old, spec["divergence"], spec["delta"])  # no cap
    # exact: the loss calls band_bounds with the same arguments (lower_delta == delta: the plain path)
    assert torch.equal(upper, ref_upper) and torch.equal(lower, ref_lower)
    assert upper[0, 0] > 10.0  # p = 0.001: above the band methods' cap of 10
    assert "band/truncated_frac" in loss_fn.band_metrics


def test_presets():
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    full = demo.config_from_args(parser.parse_args(["--full"]))
    assert (full.seeds, full.rollouts, full.methods) == (5, 80, list(demo.METHODS))
    default = demo.config_from_args(parser.parse_args([]))
    assert default.methods == demo.DEFAULT_METHODS and default.workers == 2
    assert len(default.methods) == 4 and {"clip", "band-kl", "band-kl-floor"} <= set(default.methods)  # ~5 min
    with pytest.raises(ValueError):
        demo.config_from_args(parser.parse_args(["--full", "--quick"]))


# ------------------------------------------------------------------ the loop with a Hugging Face model
VOCAB, PAD, END, BOS, WIDTH = 16, 0, 1, 2, 6  # a reply is at most WIDTH tokens, END included


def _tiny_llama(seed: int = 0) -> torch.nn.Module:
    """A random LlamaForCausalLM (one layer, hidden 16): another architecture than the demo's Qwen2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)  # fmt: skip
    return LlamaForCausalLM(config)


def _prompts(n: int, gen: torch.Generator) -> torch.Tensor:
    """(n, 3) prompts: BOS and two random ordinary tokens."""
    return torch.cat([torch.full((n, 1), BOS), torch.randint(3, VOCAB, (n, 2), generator=gen)], dim=1)


@torch.no_grad()
def _sample_until_end(model, prompts: torch.Tensor, g: int, gen: torch.Generator) -> loop.Samples:
    """g replies per prompt at temperature 1 from the model's `.logits`, each up to and including its first
    END; the tokens after it are padding (PAD, out of the attention and action masks)."""
    model.eval()
    sequences = prompts.repeat_interleave(g, 0)
    for _ in range(WIDTH):
        probs = torch.softmax(model(input_ids=sequences).logits[:, -1].float(), dim=-1)
        sequences = torch.cat([sequences, torch.multinomial(probs, 1, generator=gen)], dim=1)
    reply = sequences[:, prompts.shape[1] :]
    is_end = (reply == END).long()
    action_mask = (is_end.cumsum(-1) - is_end == 0).float()  # no END before this position
    reply = torch.where(action_mask.bool(), reply, PAD)
    attention_mask = torch.cat([torch.ones_like(sequences[:, : prompts.shape[1]]), action_mask.long()], dim=1)
    return loop.Samples(torch.cat([sequences[:, : prompts.shape[1]], reply], dim=1), attention_mask, action_mask)


def _low_half_share(prompts: torch.Tensor, samples: loop.Samples) -> torch.Tensor:
    """(N * G,) the share of a reply's tokens in the lower half of the vocabulary (a reward with signal in
    every group of a random model)."""
    low = (samples.sequences[:, -WIDTH:] < VOCAB // 2).float() * samples.action_mask
    return low.sum(-1) / samples.action_mask.sum(-1)


@pytest.mark.parametrize("method", ["clip", "band-kl-entropy-floor"])  # the entropy-adaptive radius reads entropies
def test_a_hugging_face_llama_takes_one_update_through_the_loop(method):
    model = _tiny_llama()
    reference = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = demo.DemoConfig()
    settings = loop.LoopSettings(rollouts=1, prompts_per_rollout=2, samples_per_prompt=8, epochs=1, minibatches=2,
                                 lr=1e-2, kl_coef=0.001)  # fmt: skip
    trainer = loop.GRPOTrainer(model, demo.make_loss(method, cfg), settings, reference=reference,
                               bounds_of=demo.method_bounds(method, cfg))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = _prompts(settings.prompts_per_rollout, gen)
    samples = _sample_until_end(model, prompts, settings.samples_per_prompt, gen)
    assert (samples.action_mask.sum(-1) >= 1).all() and samples.sequences.shape == (16, 3 + WIDTH)
    rewards = _low_half_share(prompts, samples)
    assert rewards.reshape(2, 8).std(-1).max() > 0  # some group has signal (else nothing would move)
    losses = trainer.update(samples, rewards, gen)
    assert len(losses) == settings.minibatches and all(math.isfinite(x) for x in losses)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))  # the policy moved
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), before))  # the reference did not
    metrics = trainer.take_metrics()
    assert 0.0 <= metrics["clip_frac"] <= 1.0
    counted = sum(metrics[f"n_pos_{name}"] + metrics[f"n_neg_{name}"] for *_, name in loop.BINS)
    assert 0 < counted <= int(samples.action_mask.sum())  # one epoch: each reply token once at most, padding never


def test_train_grpo_gives_one_row_per_evaluation_for_a_hugging_face_model():
    model = _tiny_llama(seed=1)
    settings = loop.LoopSettings(rollouts=2, prompts_per_rollout=2, samples_per_prompt=4, epochs=1, minibatches=1,
                                 lr=1e-2, eval_every=1)  # fmt: skip
    probe = _prompts(4, torch.Generator().manual_seed(7))

    def evaluate(policy) -> dict[str, float]:  # the first reply token's mean log-probability of END
        with torch.no_grad():
            return {"log_p_end": torch.log_softmax(policy(input_ids=probe).logits[:, -1], -1)[:, END].mean().item()}

    rows = loop.train_grpo(model, demo.make_loss("clip", demo.DemoConfig()), settings, next_prompts=_prompts,
                           sample=_sample_until_end, reward=_low_half_share, gen=torch.Generator().manual_seed(0),
                           evaluate=evaluate, labels={"method": "clip"})  # fmt: skip
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["method"] == "clip" for r in rows)
    assert all(math.isfinite(r["log_p_end"]) for r in rows) and rows[2]["log_p_end"] != rows[0]["log_p_end"]
    assert "clip_frac" not in rows[0] and all(0.0 <= r["clip_frac"] <= 1.0 for r in rows[1:])


def test_the_loop_imports_nothing_of_the_demo():
    """The loop is task-free: the prompts, sampling, reward and evaluation come in as arguments."""
    tree = ast.parse(Path(loop.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(name.startswith("openrlhf_band.tools") for name in imported), imported


# ------------------------------------------------------------------ a lagging sampler and the rollout anchor
def _weights(model) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


@pytest.mark.parametrize("lag", [1, 2])
def test_a_lagging_sampler_samples_with_the_weights_of_lag_updates_ago(lag):
    model = _tiny_llama(seed=2)
    settings = loop.LoopSettings(rollouts=5, prompts_per_rollout=2, samples_per_prompt=4, epochs=1, minibatches=1,
                                 lr=1e-2, eval_every=1, sampler_lag=lag)  # fmt: skip
    versions, sampled_with = [], []  # the policy's weights after each update (the start first); the sampler's

    def evaluate(policy) -> dict[str, float]:  # runs at step 0 and after every update (eval_every 1)
        versions.append(_weights(policy))
        return {}

    samples = []

    def sample(sampler, prompts, g, gen):
        sampled_with.append(_weights(sampler))
        samples.append(_sample_until_end(sampler, prompts, g, gen))
        return samples[-1]

    spy = _Spy(demo.make_loss("drpo", demo.DemoConfig()))  # DRPO reads mu: one call a rollout (1 epoch x 1 batch)
    loop.train_grpo(model, spy, settings, next_prompts=_prompts, sample=sample, reward=_low_half_share,
                    gen=torch.Generator().manual_seed(0), evaluate=evaluate)  # fmt: skip
    assert len(sampled_with) == 5 and len(versions) == 6 and len(spy.calls) == 5
    assert not all(torch.equal(a, b) for a, b in zip(versions[1], versions[0]))  # the control: the policy moved
    for step, (weights, drawn, call) in enumerate(zip(sampled_with, samples, spy.calls), start=1):
        expected = versions[max(0, step - 1 - lag)]  # rollout s samples with the weights after update s - 1 - lag
        assert all(torch.equal(a, b) for a, b in zip(weights, expected)), step
        # mu is the sampler's log-probs of what it drew; pi_old the policy's (after update s - 1)
        mu, old = (_log_probs_with(model, state, drawn) for state in (expected, versions[step - 1]))
        assert _rows_of(call["mu"], mu) and _rows_of(call["old"], old), step
        assert (step <= 1) == torch.equal(mu, old), step  # they differ once the sampler is behind


class _Spy(torch.nn.Module):
    """A loss module that records what the loop hands it, then computes the wrapped loss."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, []
        self.reads_rollout_log_probs = getattr(inner, "reads_rollout_log_probs", False)

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, **kwargs):
        self.calls.append({"old": old_log_probs.clone(), "mu": kwargs.get("rollout_log_probs"), "mask": action_mask})
        return self.inner(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)


def _one_update(method: str, anchor: str, *, shift: float):
    """One rollout of the tiny Llama through GRPOTrainer with mu = pi_old's log-probs - shift: the loss's calls,
    the number of the actor's forward passes, pi_old and mu."""
    model = _tiny_llama(seed=3)
    settings = loop.LoopSettings(rollouts=1, prompts_per_rollout=2, samples_per_prompt=4, epochs=2, minibatches=2,
                                 lr=1e-2)  # fmt: skip
    spy = _Spy(demo.make_loss(method, demo.DemoConfig()))
    trainer = loop.GRPOTrainer(model, spy, settings, anchor=anchor)
    gen = torch.Generator().manual_seed(0)
    prompts = _prompts(2, gen)
    samples = _sample_until_end(model, prompts, 4, gen)
    with torch.no_grad():
        old = loop.as_actor(model)(samples.sequences, samples.action_mask, attention_mask=samples.attention_mask)
    mu = old - shift
    forwards = []
    inner = trainer.actor.forward
    trainer.actor.forward = lambda *a, **k: forwards.append(1) or inner(*a, **k)
    trainer.update(samples, _low_half_share(prompts, samples), gen, rollout_log_probs=mu)
    return spy.calls, len(forwards), old, mu


def _log_probs_with(model, state: list[torch.Tensor], samples: loop.Samples) -> torch.Tensor:
    """The action log-probs of `samples` under `model`'s architecture with the weights `state` (a copy)."""
    twin = copy.deepcopy(model)
    twin.load_state_dict(dict(zip(model.state_dict().keys(), state)))
    twin.eval()
    with torch.no_grad():
        return loop.as_actor(twin)(samples.sequences, samples.action_mask, attention_mask=samples.attention_mask)


def _rows_of(minibatch: torch.Tensor, full: torch.Tensor) -> bool:
    """Every row of `minibatch` is a row of `full` (the trainer draws the minibatches' rows at random)."""
    return all(any(torch.equal(row, other) for other in full) for row in minibatch)


def test_the_rollout_anchor_centres_on_the_samplers_log_probs_without_a_recompute_pass():
    calls, forwards, old, mu = _one_update("band-kl-rollout", "rollout", shift=0.25)
    assert forwards == 4  # 2 epochs x 2 minibatches: no pi_old pass
    assert all(_rows_of(call["old"], mu) and call["mu"] is None for call in calls)
    calls, forwards, old, mu = _one_update("band-kl", "recomputed", shift=0.25)  # the control
    assert forwards == 5 and all(_rows_of(call["old"], old) and not _rows_of(call["old"], mu) for call in calls)


def test_drpo_and_ipo_get_mu_as_rollout_log_probs_and_pi_old_recomputed():
    for method in ("drpo", "ipo"):
        calls, forwards, old, mu = _one_update(method, "recomputed", shift=0.25)
        assert forwards == 5 and len(calls) == 4
        for call in calls:
            assert _rows_of(call["old"], old) and _rows_of(call["mu"], mu) and not _rows_of(call["mu"], old)


def test_at_lag_0_the_rollout_anchor_is_the_recomputed_one_bit_for_bit(warm_state):
    cfg = demo.DemoConfig(rollouts=2, eval_every=1, eval_prompts=64)
    recomputed, rollout = (demo.train_method(m, 0, warm_state, cfg) for m in ("band-kl", "band-kl-rollout"))
    assert rollout[2]["mean@32"] != rollout[0]["mean@32"]  # it trained
    assert [{**r, "method": None} for r in rollout] == [{**r, "method": None} for r in recomputed]


def test_a_lag_is_a_whole_number_of_versions():
    with pytest.raises(ValueError, match="sampler_lag must be a whole number"):
        loop.LoopSettings(rollouts=1, prompts_per_rollout=1, samples_per_prompt=2, epochs=1, minibatches=1, lr=1.0,
                          sampler_lag=-1)  # fmt: skip
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.config_from_args(parser.parse_args(["--lag", "2"])).loop_settings().sampler_lag == 2
    with pytest.raises(ValueError, match="--lag >= 0"):
        demo.config_from_args(parser.parse_args(["--lag", "-1"]))
    with pytest.raises(ValueError, match="anchor must be one of"):
        loop.GRPOTrainer(_tiny_llama(), demo.make_loss("clip", demo.DemoConfig()),
                         loop.LoopSettings(1, 1, 2, 1, 1, 1.0), anchor="sampler")  # fmt: skip
