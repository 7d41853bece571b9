"""The methods as the demo runs them: what it reads of each registered method (METHODS: its kind and
options, from the `train_ppo_ray` flags in openrlhf_band.integration.methods, the one source), the demo's
own settings after those flags (the torch backend, DemoConfig's radius and cap), the bounds each method
clips to (`method_bounds`, what the clip rates count against) and its loss module (`make_loss`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from openrlhf_band.integration.methods import METHOD_FLAGS, method_loss_kwargs, method_spec, resolve_method
from openrlhf_band.tools.demo.config import DEFAULT_METHODS, DemoConfig


# Each method is a way to get (lower, upper) ratio bounds from the old log-probs, named as in
# openrlhf_band.integration.methods (the train_ppo_ray flags of each, the one source): "clip" kinds run
# through OpenRLHF's PolicyLoss, the others through BandPolicyLoss built from those flags, with the
# demo's radius (DemoConfig.delta, 0.05) and cap (10) for the band rules (DPPO keeps its own radii and
# has no cap; DCPO takes the cap). METHODS holds what the demo reads of each: its kind and options.
# One diagnostic is the demo's own: "band-kl+clip-low", the kl band's upper bound with the fixed
# clip's lower bound (tests the reason given for the band's lower entropy: its lower bound goes to 0
# for rare tokens); the floor (lower bound max(r_low, F)) is its training form: the kl band's own
# r_low (delta 0.05) exceeds 0.8 for p > 0.751 (0.867 at p = 0.9), where the floor leaves it alone.
def _facets(name: str) -> dict:
    """What the demo reads of a registered method, from what its flags resolve to (resolved once)."""
    method = resolve_method(name)
    loss_type, loss_kwargs = method.loss_type, method.loss_kwargs
    if loss_kwargs is None:
        if loss_type == "ppo":
            return {"kind": "clip", "eps": method.clip_eps}
        return {"kind": "objective", "objective": loss_type, "eps": method.clip_eps,
                "options": method.objective_options}  # fmt: skip
    spec = loss_kwargs["band"]
    if loss_type == "cispo":  # CISPO with the band's bounds
        return {"kind": "band-cispo", "divergence": spec.divergence}
    return _RULE_FACETS[spec.rule](spec, loss_kwargs)


def _trust_region_facets(spec, loss_kwargs: dict) -> dict:
    facets = {"kind": "band", "divergence": spec.divergence}
    if loss_kwargs.get("anchor", "recomputed") != "recomputed":  # centred on the sampler's log-probs
        facets["anchor"] = loss_kwargs["anchor"]
    if loss_kwargs["adaptive"] != "none":
        facets["adaptive"] = loss_kwargs["adaptive"]
    if spec.lower_floor is not None:
        facets["lower_floor"] = spec.lower_floor
    return facets


#: what the demo reads of a method of each band rule (openrlhf_band.band.rules.RULES), by the rule's name
_RULE_FACETS: dict[str, Callable[..., dict]] = {
    "trust_region": _trust_region_facets,
    "dcpo": lambda spec, loss_kwargs: {"kind": "dcpo", "eps": spec.dcpo_eps},
    "dppo": lambda spec, loss_kwargs: {"kind": "dppo", "divergence": spec.divergence, "delta": spec.delta,
                                       "lower_delta": spec.lower_delta, "truncation": spec.ratio_truncation},
}  # fmt: skip


METHODS: dict[str, dict] = {}
for _name in METHOD_FLAGS:
    METHODS[_name] = _facets(_name)
    if _name == "dcpo":
        METHODS["band-kl+clip-low"] = {"kind": "band-upper-clip-lower", "divergence": "kl", "eps_low": 0.2}
del _name
if not set(DEFAULT_METHODS) <= set(METHODS):
    unknown = sorted(set(DEFAULT_METHODS) - set(METHODS))
    raise ValueError(f"DEFAULT_METHODS (tools/demo/config.py) names methods the demo does not have: {unknown}")


def method_anchor(method: str) -> str:
    """Where the method centres its update: "rollout" (pi_old = the sampler's log-probs, `--actor.band.anchor
    rollout`) or "recomputed" (pi_old from the current weights, every other method)."""
    return METHODS[method].get("anchor", "recomputed")


def _demo_flags(method: str, cfg: DemoConfig) -> tuple[str, ...]:
    """The demo's settings after a method's flags: the torch backend (CPU), and DemoConfig's radius
    and cap for the band rules (DPPO keeps its radii and has no cap; DCPO takes the cap)."""
    kind = METHODS[method]["kind"]
    if kind == "objective":
        return ()
    flags = ("--actor.band.backend", "torch")
    if kind in ("band", "band-cispo"):
        flags += ("--band_delta", repr(cfg.delta), "--actor.band.upper_cap", repr(cfg.upper_cap))
    elif kind == "dcpo":
        flags += ("--actor.band.upper_cap", repr(cfg.upper_cap))
    return flags


def method_bounds(method: str, cfg: DemoConfig) -> Callable[[Tensor], tuple[Tensor, Tensor]] | None:
    """old_log_probs -> (lower, upper): the bounds the method clips to (also used for its clip stats); None
    for an objective without a clip interval (SAPO, KL-Cov)."""
    from openrlhf_band.band.bounds import band_bounds, spec_bounds

    facets = METHODS[method]
    kind = facets["kind"]
    if kind == "clip":
        eps_low, eps_high = facets["eps"]
        return lambda old: (torch.full_like(old, 1 - eps_low), torch.full_like(old, 1 + eps_high))
    if kind in ("band", "dppo", "dcpo", "band-cispo"):  # (the loss reports the per-token bounds it used)
        return functools.partial(spec_bounds, method_spec(method, *_demo_flags(method, cfg)))
    if kind == "objective":  # an objective's clip interval on the ratio, where it has one
        objective, (eps_low, eps_high) = facets["objective"], facets["eps"]
        if objective in ("cispo", "clip_cov"):
            return lambda old: (torch.full_like(old, 1 - eps_low), torch.full_like(old, 1 + eps_high))
        if objective == "gmpo":  # GMPO clips log r to [-eps_low, eps_high]
            return lambda old: (torch.full_like(old, math.exp(-eps_low)), torch.full_like(old, math.exp(eps_high)))
        return None  # SAPO's gate and KL-Cov's penalty: no interval to count clips against
    if kind == "band-upper-clip-lower":

        def bounds(old):
            _, upper = band_bounds(old, facets["divergence"], cfg.delta, upper_cap=cfg.upper_cap)
            return torch.full_like(upper, 1 - facets["eps_low"]), upper

        return bounds
    raise ValueError(f"unknown method {method!r}")


def make_loss(method: str, cfg: DemoConfig) -> torch.nn.Module:
    """The method's loss module: OpenRLHF's PolicyLoss for the clip, else BandPolicyLoss from the
    method's flags as train_ppo_ray resolves them (the ablation: its bounds as bounds_fn)."""
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.integration.objective_loss import make_policy_loss
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    facets = METHODS[method]
    common = dict(token_level_loss=False)  # seq-mean-token-mean, as in the recipe
    if facets["kind"] == "clip":
        return PolicyLoss(*facets["eps"], **common)
    if facets["kind"] == "band-upper-clip-lower":
        return BandPolicyLoss(backend="torch", bounds_fn=method_bounds(method, cfg), **common)
    if facets["kind"] == "objective":
        eps_low, eps_high = facets["eps"]
        return make_policy_loss(facets["objective"], clip_eps_low=eps_low, clip_eps_high=eps_high, **facets["options"],
                                **common)  # fmt: skip
    if facets["kind"] == "band-cispo":
        return BandPolicyLoss(policy_loss_type="cispo", **method_loss_kwargs(method, *_demo_flags(method, cfg)),
                              **common)  # fmt: skip
    return BandPolicyLoss(**method_loss_kwargs(method, *_demo_flags(method, cfg)), **common)
