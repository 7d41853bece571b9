"""BandPO for OpenRLHF: probability-aware trust-region ratio bounds and the Band policy loss."""

from openrlhf_band.bounds import band_bounds
from openrlhf_band.divergences import DIVERGENCES, Divergence, get_divergence, register_divergence
from openrlhf_band.functional import band_token_loss
from openrlhf_band.openrlhf_glue import BandPolicyLoss
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
