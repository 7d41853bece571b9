"""The math: the divergence registry, the Band operator (`band_bounds`) and DCPO's clip rule."""
