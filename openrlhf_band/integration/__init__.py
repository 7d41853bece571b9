"""The runtime face, what the patched OpenRLHF calls: the loss flags (the band's and the registered
objectives') and their validation, `BandPolicyLoss`, `ObjectivePolicyLoss`, their metrics, the hooks
around the loss, the fused log-probs head, and the stand-ins that let the patched OpenRLHF import
without flash-attn or vLLM. The commands that operate on an OpenRLHF install (the patch tool,
check-args, the patch set) are in `openrlhf_band.patching`.

This package is the one import path of the patch set: the patched OpenRLHF files import only names
re-exported here, so moving code inside openrlhf_band never changes the patches.
"""

from openrlhf_band.integration.compat import (
    all_gather,
    index_first_axis,
    missing_vllm,
    pad_input,
    rearrange,
    unpad_input,
)
from openrlhf_band.integration.flags import (
    add_band_arguments,
    add_loss_arguments,
    band_loss_kwargs,
    validate_band_arguments,
    validate_loss_arguments,
)
from openrlhf_band.integration.fused_head import (
    add_fused_logprobs_argument,
    fused_forward,
    install_fused_head,
    validate_fused_logprobs_arguments,
)
from openrlhf_band.integration.hooks import (
    band_after_step,
    band_checkpoint_state,
    band_load_checkpoint_state,
    band_loss_inputs,
    loss_class_and_kwargs,
    loss_metrics,
)
from openrlhf_band.integration.metrics import band_metrics
from openrlhf_band.integration.objective_flags import LOSS_TYPES
from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss, make_policy_loss
from openrlhf_band.integration.policy_loss import BandPolicyLoss

__all__ = [
    "LOSS_TYPES",
    "BandPolicyLoss",
    "ObjectivePolicyLoss",
    "add_band_arguments",
    "add_loss_arguments",
    "add_fused_logprobs_argument",
    "all_gather",
    "band_after_step",
    "band_checkpoint_state",
    "band_load_checkpoint_state",
    "band_loss_inputs",
    "band_loss_kwargs",
    "band_metrics",
    "fused_forward",
    "index_first_axis",
    "install_fused_head",
    "loss_class_and_kwargs",
    "loss_metrics",
    "make_policy_loss",
    "missing_vllm",
    "pad_input",
    "rearrange",
    "unpad_input",
    "validate_band_arguments",
    "validate_fused_logprobs_arguments",
    "validate_loss_arguments",
]
