"""What every loss path computes, captured layout-independently, to show that a restructure of the loss wrappers
changed nothing: each demo method's module (`openrlhf_band.tools.demo.make_loss`) and each objective's and the band's
module through `make_policy_loss`, in token-mean and seq-mean-token-mean, with and without the train/rollout IS
correction, on fixed inputs whose masked positions hold nan and inf; for each, the loss, its gradient, the clip
ratio, ppo_kl, the IS outputs and the module's metrics, as exact float reprs. Then short demo runs of every demo
method from one warm-up (the rows each writes) and the mechanism check. Only public entry points, so the same file
runs in a checkout of any layout:

    OMP_NUM_THREADS=1 .venv/bin/python tests/support/loss_capture.py OUT.json [--no-demo]

tests/fixtures/unchanged/losses_at_630bce4.json is its output at 630bce4, before the one loss wrapper (issue 59);
tests/integration/test_loss_unchanged.py holds the current code to it.
"""

from __future__ import annotations

import json
import sys

import torch

#: make_policy_loss cases: (label, name, options)
MODULE_CASES = [
    ("band-kl", "band", {"divergence": "kl", "delta": 0.05, "backend": "torch"}),
    ("band-chi2-dual", "band", {"divergence": "chi2", "delta": 0.05, "dual_clip": 3.0, "backend": "torch"}),
    ("band-tv-floor", "band", {"divergence": "tv", "delta": 0.1, "lower_floor": 0.8, "backend": "torch"}),
    ("band-kl-relax", "band", {"divergence": "kl", "delta": 0.05, "relax": (0.2, 0.28), "backend": "torch"}),
    ("band-kl-entropy", "band", {"divergence": "kl", "delta": 0.05, "adaptive": "entropy", "backend": "torch"}),
    (
        "dppo-tv",
        "band",
        {
            "divergence": "tv",
            "delta": 0.15,
            "rule": "dppo",
            "upper_cap": None,
            "ratio_truncation": 5.0,
            "backend": "torch",
        },
    ),
    (
        "dppo-kl-asym",
        "band",
        {
            "divergence": "kl",
            "delta": 0.05,
            "lower_delta": 0.02,
            "rule": "dppo",
            "upper_cap": None,
            "ratio_truncation": 5.0,
            "backend": "torch",
        },
    ),
    ("dcpo", "band", {"divergence": "kl", "rule": "dcpo", "dcpo_eps": (0.16, 0.2), "backend": "torch"}),
    ("band-cispo-kl", "cispo", {"bounds": "band", "divergence": "kl", "delta": 0.05}),
    ("band-cispo-floor", "cispo", {"bounds": "band", "divergence": "kl", "delta": 0.05, "lower_floor": 0.8}),
    ("cispo", "cispo", {}),
    ("sapo", "sapo", {}),
    ("gmpo", "gmpo", {}),
    ("clip_cov", "clip_cov", {}),
    ("kl_cov", "kl_cov", {}),
    ("ppo", "ppo", {}),
    ("ppo-dual", "ppo", {"dual_clip": 3.0}),
]
#: (label, constructor options) of OpenRLHF's shared arguments
VARIANTS = [
    ("token-mean", {"token_level_loss": True}),
    ("seq-mean", {"token_level_loss": False}),
    ("is-token-clip", {"token_level_loss": True, "is_correction_level": "token", "is_correction_mode": "clip"}),
    ("is-seq-mask", {"token_level_loss": False, "is_correction_level": "seq", "is_correction_mode": "mask"}),
]


def _floats(t) -> list | float | None:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        t = t.detach().double()
        return [repr(x) for x in t.flatten().tolist()] if t.dim() else repr(t.item())
    return repr(t)


def inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 12
    old = torch.log(torch.rand(B, T, generator=g).clamp(1e-6, 1.0) ** 3)  # many rare tokens
    new = old + 0.6 * torch.randn(B, T, generator=g)
    rollout = old + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).clone()
    mask = torch.ones(B, T)
    mask[0, 9:] = 0
    mask[2, 5:] = 0
    mask[3, 0] = 0
    for t in (old, new, rollout):  # masked positions hold anything
        t[mask == 0] = torch.tensor([float("nan"), float("inf"), -float("inf")]).repeat(int((mask == 0).sum()))[
            : int((mask == 0).sum())
        ]
    entropy = torch.rand(B, T, generator=g) * 2
    return {"old": old, "new": new, "rollout": rollout, "adv": adv, "mask": mask, "entropy": entropy}


def run_module(module, x: dict, entropy: bool = False) -> dict:
    new = x["new"].clone().requires_grad_(True)
    kwargs = {"entropy": x["entropy"]} if entropy else {}
    out = module(new, x["old"], x["adv"], x["mask"], x["rollout"], 1, float(x["mask"].sum()), 4.0, **kwargs)
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter = out
    loss.backward()
    metrics = getattr(module, "band_metrics", None) or getattr(module, "loss_metrics", None) or {}
    return {
        "loss": _floats(loss),
        "grad": _floats(torch.nan_to_num(new.grad, nan=12345.0)),
        "clip_ratio": _floats(clip_ratio),
        "ppo_kl": _floats(ppo_kl),
        "vllm_kl": _floats(vllm_kl),
        "is_filter_ratio": _floats(is_filter),
        "metrics": {k: _floats(v) for k, v in sorted(metrics.items())},
    }


def capture_modules() -> dict:
    from openrlhf_band.integration.objective_loss import make_policy_loss

    x = inputs()
    out = {}
    for label, name, options in MODULE_CASES:
        for variant, shared in VARIANTS:
            opts = dict(options)
            try:
                module = make_policy_loss(name, **shared, **opts)
                out[f"{label}/{variant}"] = run_module(module, x, entropy=opts.get("adaptive") == "entropy")
            except ValueError as e:  # a refusal is behaviour too
                out[f"{label}/{variant}"] = {"refused": str(e)}
    return out


def capture_demo_losses() -> dict:
    from openrlhf_band.tools import demo

    cfg = demo.DemoConfig()
    x = inputs(1)
    finite = {k: torch.nan_to_num(v, nan=-1.0, posinf=0.0, neginf=-30.0) for k, v in x.items()}
    out = {}
    for method in demo.METHODS:
        module = demo.make_loss(method, cfg)
        entropy = getattr(module, "needs_entropy", False)
        out[method] = run_module(module, x, entropy=entropy)
        out[method]["finite_masked"] = run_module(demo.make_loss(method, cfg), finite, entropy=entropy)
        bounds = demo.method_bounds(method, cfg)
        if bounds is not None:
            lo, hi = bounds(torch.nan_to_num(x["old"], nan=-1.0, posinf=0.0, neginf=-30.0))
            out[method]["bounds"] = [_floats(lo), _floats(hi)]
    return out


def capture_demo_runs() -> dict:
    from openrlhf_band.tools import demo

    small = dict(warmup_steps=30, rollouts=3, eval_every=3, eval_prompts=32, prompts_per_rollout=4,
                 samples_per_prompt=4, epochs=2, minibatches=4)  # fmt: skip
    cfg = demo.DemoConfig(**small)
    model = demo.build_model(cfg, 0)
    demo.warm_up(model, cfg, 0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    runs = {method: json.loads(json.dumps(demo.train_method(method, 0, state, cfg))) for method in demo.METHODS}
    runs["mechanism"] = json.loads(json.dumps(demo.mechanism_check(cfg, state, max_updates=60)))
    return runs


def capture(with_demo: bool = True) -> dict:
    torch.manual_seed(0)
    result = {"modules": capture_modules(), "demo_losses": capture_demo_losses()}
    if with_demo:
        result["demo_runs"] = capture_demo_runs()
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    path = sys.argv[1]
    result = capture(with_demo="--no-demo" not in sys.argv)
    with open(path, "w") as f:
        json.dump(result, f, indent=0, sort_keys=True)
        f.write("\n")
    print(path, {k: len(v) for k, v in result.items()})
