"""BandPO for OpenRLHF: probability-aware trust-region ratio bounds and the Band policy loss.

The public names are imported on first use (PEP 562), so that `import openrlhf_band.<layer>` (the
patched OpenRLHF, the CLI) does not import torch and every layer before it is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from openrlhf_band._lazy import lazy_names

_PUBLIC = {
    "band_bounds": "openrlhf_band.band.bounds",
    "DIVERGENCES": "openrlhf_band.band.divergences",
    "Divergence": "openrlhf_band.band.divergences",
    "get_divergence": "openrlhf_band.band.divergences",
    "register_divergence": "openrlhf_band.band.divergences",
    "band_token_loss": "openrlhf_band.functional",
    "BandKernelFallbackWarning": "openrlhf_band.ops.fallback",
    "BandPolicyLoss": "openrlhf_band.integration.policy_loss",
    "BandTokenLoss": "openrlhf_band.ops.token_loss",
    "BandSpec": "openrlhf_band.band.spec",
    "fused_linear_logprobs": "openrlhf_band.ops.fused_logprobs",
    "make_policy_loss": "openrlhf_band.integration.objective_loss",
    "ObjectivePolicyLoss": "openrlhf_band.integration.objective_loss",
    "register_objective": "openrlhf_band.objectives.registry",
}
__all__ = [
    "DIVERGENCES",
    "BandKernelFallbackWarning",
    "BandPolicyLoss",
    "BandSpec",
    "BandTokenLoss",
    "Divergence",
    "band_bounds",
    "band_token_loss",
    "ObjectivePolicyLoss",
    "fused_linear_logprobs",
    "get_divergence",
    "make_policy_loss",
    "register_divergence",
    "register_objective",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from openrlhf_band.band.bounds import band_bounds
    from openrlhf_band.band.divergences import DIVERGENCES, Divergence, get_divergence, register_divergence
    from openrlhf_band.band.spec import BandSpec
    from openrlhf_band.functional import band_token_loss
    from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss, make_policy_loss
    from openrlhf_band.integration.policy_loss import BandPolicyLoss
    from openrlhf_band.objectives.registry import register_objective
    from openrlhf_band.ops.fallback import BandKernelFallbackWarning
    from openrlhf_band.ops.fused_logprobs import fused_linear_logprobs
    from openrlhf_band.ops.token_loss import BandTokenLoss


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
