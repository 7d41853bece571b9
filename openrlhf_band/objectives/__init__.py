"""Policy objectives beside the band (CISPO, SAPO, GMPO, Clip-Cov, KL-Cov, GPG; DRPO and IPO, whose ratio is
against the sampler): a registry (`registry.py`) and the built-in entries (`losses.py`, `sampler.py`). A new
objective is one registered function in `losses.py` (or a module of its own imported here): it gets its
`--actor.<name>.*` flags, `make_policy_loss`, the check-args report and its metrics from the entry."""

from openrlhf_band.objectives import losses, sampler  # noqa: F401  (register the built-in objectives)
from openrlhf_band.objectives.registry import (
    OBJECTIVES,
    Objective,
    ObjectiveLoss,
    ObjectiveOption,
    get_objective,
    register_objective,
)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveLoss", "ObjectiveOption", "get_objective", "register_objective"]
