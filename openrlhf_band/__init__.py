"""BandPO for OpenRLHF: probability-aware trust-region ratio bounds and the Band policy loss."""

from openrlhf_band.band.bounds import band_bounds
from openrlhf_band.band.divergences import DIVERGENCES, Divergence, get_divergence, register_divergence
from openrlhf_band.functional import band_token_loss
from openrlhf_band.integration.policy_loss import BandPolicyLoss
from openrlhf_band.ops.reference import BandTokenLoss

__all__ = [
    "DIVERGENCES",
    "BandPolicyLoss",
    "BandTokenLoss",
    "Divergence",
    "band_bounds",
    "band_token_loss",
    "get_divergence",
    "register_divergence",
]
__version__ = "0.1.0"
