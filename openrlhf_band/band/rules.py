"""The band's rules, each declared once: which ratio bounds a token gets from its old probability, which of the
band's options and flags it takes, and what the loss, the flags and check-args do with it.

A rule is one `BandRule` in `RULES` (the value of `BandSpec.rule` and of `--actor.band.rule`). Every layer reads
the rule's fields instead of comparing its name: the spec's validation (`check_spec`), the bounds (`bounds`),
the backend dispatch in functional.py (`roots_in_kernel`), the loss (`has_radius`, `takes_cispo`,
`takes_dual_clip`, `metrics`), the flags (`refuses`, `refusal`, `own`, `divergences`, `prepare_flags`,
`spec_from_flags`, `resolved_config`) and the demo (openrlhf_band/tools/demo/methods.py). Adding a rule is one
`BandRule(...)` in `RULES` plus its bounds (docs/architecture.md, "Add a rule").

Flags are named by their key in `args.actor.band` (`divergence`, `delta`, `upper_cap`, ...); `flag_name` gives the
command-line spelling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from openrlhf_band.band.spec import BandSpec

#: the flag of each band option, as messages name it (two have short aliases users type)
SHORT_FLAGS = {"divergence": "--band_divergence", "delta": "--band_delta"}
#: the adaptive radius' option keys (openrlhf_band/band/adaptive.py)
ADAPTIVE_KEYS = ("adaptive", "entropy_power", "delta_range", "target_entropy", "controller_rate")
#: DPPO's truncation c of the importance ratio in its gradient weight min(r, c). The DPPO authors'
#: scripts (verl-project/verl examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh: radii tv 0.15, kl 0.05)
#: pass clip_ratio_c=10000.0: a large c, as verl's dppo code advises
#: ("a large threshold is recommended to avoid performance degradation due to the truncation bias",
#: the paper's section 5.4). verl's dppo functions fall back to 20 only without a config value, which its
#: trainer never lacks: its ActorConfig sets clip_ratio_c = 3.0, the dual-clip constant of its PPO loss,
#: which a verl user who does not pass clip_ratio_c gets as DPPO's truncation.
DPPO_DEFAULT_TRUNCATION = 1e4


def _check_no_dcpo_eps(spec: BandSpec, div) -> None:
    if spec.dcpo_eps is not None:
        raise ValueError(f"dcpo_eps is the dcpo rule's: the {spec.rule} rule does not take it")


def flag_name(key: str) -> str:
    """`--actor.band.KEY`, or its short alias where users type one."""
    return SHORT_FLAGS.get(key, f"--actor.band.{key}")


@dataclass(frozen=True)
class BandRule:
    """One rule of the band.

    name: `BandSpec.rule` and `--actor.band.rule NAME`.
    summary: one line: what bounds a token gets.
    refuses: the band options (keys of args.actor.band) the rule cannot take, in the order refusals name them;
        `own` options of another rule are refused too, with that rule's name.
    refusal: why it refuses them, for the message "FLAG does not apply to --actor.band.rule NAME (refusal)".
    own: options only this rule takes (another rule refuses them: "FLAG is LABEL's").
    label: how messages name the rule's owner ("DPPO").
    divergences: the divergences it takes (None: every registered one).
    has_radius: its bounds come from the trust region's radius delta: a per-call radius and the adaptive radius
        apply (DCPO's depend on its eps alone).
    adaptive_radius: the adaptive radius' options apply (--actor.band.adaptive, the controller).
    roots_in_kernel: the fused kernel computes its roots from (divergence, delta); otherwise its bounds are
        computed beforehand (`bounds`) and handed to the kernel.
    takes_cispo: it can be CISPO's bounds (`--loss cispo --actor.cispo.bounds band`).
    takes_dual_clip: OpenRLHF's --actor.dual_clip applies; dual_clip_refusal: why not, where it does not.
    reads_clip_eps: it reads --actor.eps_clip_low_high (DCPO's eps), so those flags are not refused with it.
    metrics: the `band/*` metrics only this rule's loss can log, beyond every rule's (integration/metrics.py):
        BandPolicyLoss computes a metric here only for a rule that declares it.
    check_spec: (spec, divergence) -> None, the rule's own checks of a BandSpec (ValueError), and its canonical
        values of the rule's own fields.
    bounds: (spec, old_log_probs, radius, apply_floor) -> (lower, upper, upper_at_edge).
    prepare_flags: (band namespace, args) -> a one-line refusal or None; fills the rule's defaults in place.
    spec_from_flags: band namespace -> BandSpec.
    resolved_config: band namespace -> what check-args prints under "band".
    """

    name: str
    summary: str
    refuses: tuple[str, ...]
    refusal: str
    bounds: Callable[..., tuple[Tensor, Tensor, Tensor]]
    spec_from_flags: Callable[[object], BandSpec]
    resolved_config: Callable[[object], dict]
    own: tuple[str, ...] = ()
    label: str = ""
    divergences: tuple[str, ...] | None = None
    has_radius: bool = True
    adaptive_radius: bool = False
    roots_in_kernel: bool = True
    takes_cispo: bool = True
    takes_dual_clip: bool = True
    dual_clip_refusal: str = ""
    reads_clip_eps: bool = False
    metrics: tuple[str, ...] = ()
    check_spec: Callable[[BandSpec, object], None] = field(default=_check_no_dcpo_eps)
    prepare_flags: Callable[[object, object], str | None] = field(default=lambda band, args: None)


def get_rule(name: str) -> BandRule:
    """The rule named `name` (ValueError listing the rules)."""
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {name!r}") from None


# ---------------------------------------------------------------------------------------------- bounds
def _root_bounds(spec: BandSpec, old_log_probs: Tensor, radius: Tensor | None, apply_floor: bool):
    from openrlhf_band.band.bounds import spec_bounds_with_edge

    return spec_bounds_with_edge(spec, old_log_probs, radius, apply_floor=apply_floor)


def _dcpo_bounds(spec: BandSpec, old_log_probs: Tensor, radius: Tensor | None, apply_floor: bool):
    import torch

    from openrlhf_band.band.dcpo import dcpo_rule_bounds

    lower, upper = dcpo_rule_bounds(spec, old_log_probs, apply_floor=apply_floor)
    return lower, upper, torch.zeros(upper.shape, dtype=torch.bool, device=upper.device)


# ---------------------------------------------------------------------------------------------- spec checks
def _check_dppo_spec(spec: BandSpec, div) -> None:
    if div.name not in DPPO.divergences:
        raise ValueError(f"the dppo rule takes divergence tv or kl (DPPO's binary TV / KL), got {div.name!r}")
    refused = [name for name in DPPO.refuses if getattr(spec, name, None) is not None]  # the spec's fields of them
    if refused:
        raise ValueError(f"the dppo rule has no {refused[0]} (DPPO's mask is the binary trust region alone)")
    _check_no_dcpo_eps(spec, div)


def _check_dcpo_spec(spec: BandSpec, div) -> None:
    from openrlhf_band.band.spec import validate_dcpo

    if spec.dcpo_eps is None or len(spec.dcpo_eps) != 2:
        raise ValueError(f"the dcpo rule needs dcpo_eps = (eps_low, eps_high), got {spec.dcpo_eps!r}")
    validate_dcpo(*spec.dcpo_eps, upper_cap=spec.upper_cap)
    if spec.lower_delta is not None or spec.ratio_truncation is not None:
        raise ValueError("lower_delta and ratio_truncation are DPPO's: the dcpo rule takes neither")
    object.__setattr__(spec, "dcpo_eps", tuple(float(e) for e in spec.dcpo_eps))  # canonical, hashable


# ---------------------------------------------------------------------------------------------- flags
def _trust_region_spec(band) -> BandSpec:
    from openrlhf_band.band.spec import BandSpec

    relax = tuple(band.relax) if band.relax is not None else None
    return BandSpec(band.divergence, band.delta, band.upper_cap, relax, band.lower_floor)


def _dppo_spec(band) -> BandSpec:
    from openrlhf_band.band.spec import BandSpec

    return BandSpec(band.divergence, band.delta, lower_delta=band.delta_low_high[0],
                    ratio_truncation=band.dppo_truncation, rule="dppo")  # fmt: skip


def _dcpo_spec(band) -> BandSpec:
    from openrlhf_band.band.spec import BandSpec

    # DCPO's bounds depend on its eps alone: the trust region's knobs are not its
    return BandSpec(upper_cap=band.upper_cap, lower_floor=band.lower_floor, rule="dcpo", dcpo_eps=band.dcpo_eps)


def _prepare_dppo_flags(band, args) -> str | None:
    band.upper_cap = None  # DPPO's mask has no cap
    if band.delta_low_high is None:
        band.delta_low_high = (band.delta, band.delta)
    band.delta_low_high = tuple(band.delta_low_high)
    band.delta = band.delta_low_high[1]  # the upper root's; the lower one's is lower_delta
    if band.dppo_truncation is None:
        band.dppo_truncation = DPPO_DEFAULT_TRUNCATION
    elif band.dppo_truncation == math.inf:
        band.dppo_truncation = None
    elif not band.dppo_truncation > 0.0:  # also nan
        return f"--actor.band.dppo_truncation must be > 0 or 'none', got {band.dppo_truncation}"
    return None


def _prepare_dcpo_flags(band, args) -> str | None:
    from openrlhf_band.band.dcpo import DCPO_DEFAULT_EPS

    # OpenRLHF fills eps_clip_low_high from --actor.eps_clip later: read it now
    given_eps = args.actor.eps_clip_low_high
    band.dcpo_eps = tuple(given_eps) if given_eps is not None else DCPO_DEFAULT_EPS
    band.dcpo_eps_source = "--actor.eps_clip_low_high" if given_eps is not None else "DCPO's published values"
    return None


def _trust_region_config(band) -> dict:
    config = {
        "rule": band.rule,
        "divergence": band.divergence,
        "delta": band.delta,
        "upper_cap": band.upper_cap,
        "relax": list(band.relax) if band.relax is not None else None,
        "lower_floor": band.lower_floor,
        "backend": band.backend,
        "adaptive": None,
        "controller": None,
    }
    if band.adaptive == "entropy":
        config["adaptive"] = {
            "rule": "entropy",
            "formula": "delta_t = clamp(delta * (H_t / H_mean) ** entropy_power, *delta_range)",
            "entropy_power": band.entropy_power,
            "delta_range": list(band.delta_range),
            "entropy": "the current policy's, detached, from OpenRLHF's training forward",
            "mean_entropy": "the previous optimizer step's token mean over all ranks",
        }
    if band.target_entropy is not None:
        config["controller"] = {
            "target_entropy": band.target_entropy,
            "rate": band.controller_rate,
            "delta_range": list(band.delta_range),
        }
    return config


def _dppo_config(band) -> dict:
    return {
        "rule": "dppo",
        "divergence": band.divergence,
        "delta_low_high": list(band.delta_low_high),
        "dppo_truncation": band.dppo_truncation,
        "mask": f"no gradient where binary {band.divergence} > delta_low (A < 0, r < 1) or > delta_high "
        "(A > 0, r > 1), as the band's clip",
        "gradient_weight": "min(r, dppo_truncation)" if band.dppo_truncation is not None else "r",
        "upper_cap": None,
        "backend": band.backend,
    }


def _dcpo_config(band) -> dict:
    return {
        "rule": "dcpo",
        "dcpo_eps": list(band.dcpo_eps),
        "dcpo_eps_source": band.dcpo_eps_source,
        "upper_cap": band.upper_cap,
        "lower_floor": band.lower_floor,
        "backend": band.backend,
    }


# ---------------------------------------------------------------------------------------------- the rules
TRUST_REGION = BandRule(
    name="trust_region",
    summary="the paper's band: the two roots of g_f(p, r) = delta, then relax, the lower floor and the cap",
    refuses=(),
    refusal="",
    adaptive_radius=True,
    # the floor; the radius (a per-call or adaptive one); a ratio truncation given from Python
    metrics=("band/clip_frac_floor", "band/delta_mean", "band/delta_sq_mean", "band/truncated_frac"),
    bounds=_root_bounds,
    spec_from_flags=_trust_region_spec,
    resolved_config=_trust_region_config,
)
DPPO = BandRule(
    name="dppo",
    summary="DPPO (arXiv 2602.04879; verl's dppo_tv / dppo_kl): the binary tv / kl trust region at radii "
    "(lower_delta, delta) as a mask, no cap, relax or floor, and the ratio truncation c of the weight min(r, c)",
    refuses=("upper_cap", "relax", "lower_floor", *ADAPTIVE_KEYS),
    refusal="DPPO masks tokens outside a binary tv / kl trust region, with no cap, relax, floor or adaptive radius",
    own=("delta_low_high", "dppo_truncation"),
    label="DPPO",
    divergences=("tv", "kl"),
    metrics=("band/truncated_frac", "band/delta_mean", "band/delta_sq_mean"),
    takes_cispo=False,
    takes_dual_clip=False,
    dual_clip_refusal="DPPO bounds a token's gradient weight by its ratio truncation instead, "
    "--actor.band.dppo_truncation",
    check_spec=_check_dppo_spec,
    bounds=_root_bounds,
    prepare_flags=_prepare_dppo_flags,
    spec_from_flags=_dppo_spec,
    resolved_config=_dppo_config,
)
DCPO = BandRule(
    name="dcpo",
    summary="DCPO's probability-dependent clip from its eps alone (openrlhf_band.band.dcpo), then the floor and "
    "the cap; no divergence or radius",
    refuses=("divergence", "delta", "relax", *ADAPTIVE_KEYS),
    refusal="DCPO's bounds depend only on its eps",
    label="DCPO",
    has_radius=False,
    roots_in_kernel=False,
    reads_clip_eps=True,
    metrics=("band/clip_frac_floor",),
    check_spec=_check_dcpo_spec,
    bounds=_dcpo_bounds,
    prepare_flags=_prepare_dcpo_flags,
    spec_from_flags=_dcpo_spec,
    resolved_config=_dcpo_config,
)
#: every rule, the default first
RULES: dict[str, BandRule] = {rule.name: rule for rule in (TRUST_REGION, DCPO, DPPO)}
#: the flags only some rule takes: key -> that rule
OWNED: dict[str, BandRule] = {key: rule for rule in RULES.values() for key in rule.own}
