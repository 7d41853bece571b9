"""The one registry of policy losses: which module a `--actor.policy_loss_type` builds, and with what.

Both the patched actor (`hooks.loss_class_and_kwargs`, from `train_ppo_ray`'s arguments) and
`make_policy_loss` (from Python keywords) read it, so the decision is made in one place:

    ppo, gspo          OpenRLHF's own PolicyLoss (the actor's class, untouched)
    band               BandPolicyLoss: the band's per-token loss (`--loss band`, any rule)
    band-cispo         BandPolicyLoss(policy_loss_type="cispo"): CISPO with the band's bounds
                       (`--loss cispo --actor.cispo.bounds band`)
    <objective>        ObjectivePolicyLoss: a registered objective (openrlhf_band.objectives: cispo, sapo, gmpo,
                       clip_cov, kl_cov, ...)

Every module but OpenRLHF's is an `OpenRLHFPolicyLoss` (integration/openrlhf_loss.py), which owns OpenRLHF's
contract; an entry supplies only its per-token loss. Importing this module does not import OpenRLHF.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from openrlhf_band.integration.openrlhf_loss import OPENRLHF_AGG_MODES
from openrlhf_band.objectives import OBJECTIVES

#: OpenRLHF 0.11.2's own policy losses, which this package leaves to OpenRLHF's PolicyLoss
OPENRLHF_LOSSES = ("ppo", "gspo")


@dataclass(frozen=True)
class LossEntry:
    """One policy loss.

    key: the registry key ("band-cispo" for CISPO with the band's bounds, else the loss type).
    module: () -> the nn.Module class (imported when asked: OpenRLHF's imports OpenRLHF).
    kwargs_from_args: train_ppo_ray's hierarchized args -> the module's arguments beyond OpenRLHF's own,
        which the actor passes itself.
    band_bounds: the band gives the loss its bounds: the band's flags (`--actor.band.*`) apply.
    openrlhf: OpenRLHF's own loss: the actor keeps its class.
    """

    key: str
    module: Callable[[], type[nn.Module]]
    kwargs_from_args: Callable[[object], dict]
    band_bounds: bool = False
    openrlhf: bool = False


def _openrlhf_policy_loss() -> type[nn.Module]:
    from openrlhf.models.loss import PolicyLoss

    return PolicyLoss


def _band_policy_loss() -> type[nn.Module]:
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    return BandPolicyLoss


def _objective_policy_loss() -> type[nn.Module]:
    from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss

    return ObjectivePolicyLoss


def _band_kwargs(args) -> dict:
    from openrlhf_band.integration.flags import band_loss_kwargs

    return band_loss_kwargs(args)


def _objective_kwargs(args) -> dict:
    from openrlhf_band.integration.objective_flags import objective_loss_kwargs

    return objective_loss_kwargs(args)


def _objective_entry(name: str) -> LossEntry:
    return LossEntry(name, _objective_policy_loss, _objective_kwargs)


POLICY_LOSSES: dict[str, LossEntry] = {
    **{name: LossEntry(name, _openrlhf_policy_loss, lambda args: {}, openrlhf=True) for name in OPENRLHF_LOSSES},
    "band": LossEntry("band", _band_policy_loss, _band_kwargs, band_bounds=True),
    "band-cispo": LossEntry("band-cispo", _band_policy_loss, _band_kwargs, band_bounds=True),
    **{name: _objective_entry(name) for name in OBJECTIVES},
}


def loss_key(policy_loss_type: str, bounds: str | None = None) -> str:
    """The registry key of a loss type and, for CISPO, its `bounds` option ("fixed" or "band")."""
    return "band-cispo" if policy_loss_type == "cispo" and bounds == "band" else policy_loss_type


def loss_entry(policy_loss_type: str, bounds: str | None = None) -> LossEntry:
    """The entry of a loss type (an objective registered after import included); ValueError listing the
    registered losses when there is none."""
    if policy_loss_type == "band-cispo":  # a key, not a loss type: CISPO is the loss, the band its bounds
        raise ValueError("CISPO with the band's bounds is policy loss 'cispo' with bounds 'band' (--loss cispo "
                         "--actor.cispo.bounds band; make_policy_loss('cispo', bounds='band'))")  # fmt: skip
    key = loss_key(policy_loss_type, bounds)
    if key not in POLICY_LOSSES and key in OBJECTIVES:  # registered after this module was imported
        return _objective_entry(key)
    try:
        return POLICY_LOSSES[key]
    except KeyError:
        names = ", ".join(name for name in POLICY_LOSSES if name != "band-cispo")
        raise ValueError(f"unknown policy loss {policy_loss_type!r} (no objective of that name); registered: "
                         f"{names}") from None  # fmt: skip


def aggregation_kwargs(args) -> dict:
    """The aggregation arguments the actor's loss takes beyond OpenRLHF's `token_level_loss`: none for OpenRLHF's
    two modes; for verl's seq-mean-token-sum(-norm) the mode, and for -norm the constant normaliser, the rollout's
    max new tokens (the longest a reply can be, not a micro-batch's padded width)."""
    mode = getattr(args.actor, "loss_agg_mode", "token-mean")
    if mode in OPENRLHF_AGG_MODES:
        return {}
    if mode == "seq-mean-token-sum-norm":
        return {"loss_agg_mode": mode, "loss_scale_factor": args.rollout.max_new_tokens}
    return {"loss_agg_mode": mode}


def args_entry(args) -> LossEntry:
    """The entry train_ppo_ray's hierarchized args select (`--actor.policy_loss_type`, `--actor.cispo.bounds`)."""
    cispo = getattr(args.actor, "cispo", None)
    return loss_entry(args.actor.policy_loss_type, getattr(cispo, "bounds", None))
