"""BandPO for OpenRLHF: probability-aware trust-region ratio bounds and the Band policy loss."""

from openrlhf_band.bounds import band_bounds
from openrlhf_band.divergences import DIVERGENCES, Divergence, get_divergence, register_divergence

__all__ = ["DIVERGENCES", "Divergence", "band_bounds", "get_divergence", "register_divergence"]
__version__ = "0.1.0"
