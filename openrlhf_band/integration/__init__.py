"""The runtime face, what the patched OpenRLHF calls: the loss flags (the band's and the registered
objectives') and their validation, `BandPolicyLoss`, `ObjectivePolicyLoss`, their metrics, the hooks
around the loss, the fused log-probs head, and the stand-ins that let the patched OpenRLHF import
without flash-attn or vLLM. The commands that operate on an OpenRLHF install (the patch tool,
check-args, the patch set) are in `openrlhf_band.patching`.

This package is the one import path of the patch set: the patched OpenRLHF files import only names
re-exported here, so moving code inside openrlhf_band never changes the patches.

Names are imported on first use (PEP 562): the loss and its flags need only torch, while the
stand-ins in `compat` need einops and transformers, which a bare `pip install -e .` lacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from openrlhf_band._lazy import lazy_names

_PUBLIC = {
    "all_gather": "openrlhf_band.integration.compat",
    "index_first_axis": "openrlhf_band.integration.compat",
    "missing_vllm": "openrlhf_band.integration.compat",
    "pad_input": "openrlhf_band.integration.compat",
    "rearrange": "openrlhf_band.integration.compat",
    "unpad_input": "openrlhf_band.integration.compat",
    "add_band_arguments": "openrlhf_band.integration.flags",
    "add_loss_arguments": "openrlhf_band.integration.flags",
    "band_loss_kwargs": "openrlhf_band.integration.flags",
    "validate_band_arguments": "openrlhf_band.integration.flags",
    "validate_loss_arguments": "openrlhf_band.integration.flags",
    "add_fused_logprobs_argument": "openrlhf_band.integration.fused_head",
    "fused_forward": "openrlhf_band.integration.fused_head",
    "install_fused_head": "openrlhf_band.integration.fused_head",
    "validate_fused_logprobs_arguments": "openrlhf_band.integration.fused_head",
    "band_after_step": "openrlhf_band.integration.hooks",
    "band_checkpoint_state": "openrlhf_band.integration.hooks",
    "band_load_checkpoint_state": "openrlhf_band.integration.hooks",
    "band_loss_inputs": "openrlhf_band.integration.hooks",
    "loss_class_and_kwargs": "openrlhf_band.integration.hooks",
    "rollout_anchor_ref": "openrlhf_band.integration.hooks",
    "rollout_logprobs_mode": "openrlhf_band.integration.hooks",
    "requests_rollout_log_probs": "openrlhf_band.integration.hooks",
    "loss_metrics": "openrlhf_band.integration.hooks",
    "band_metrics": "openrlhf_band.integration.metrics",
    "LOSS_TYPES": "openrlhf_band.integration.objective_flags",
    "POLICY_LOSSES": "openrlhf_band.integration.loss_registry",
    "loss_entry": "openrlhf_band.integration.loss_registry",
    "OpenRLHFPolicyLoss": "openrlhf_band.integration.openrlhf_loss",
    "LOSS_AGG_MODES": "openrlhf_band.integration.openrlhf_loss",
    "ObjectivePolicyLoss": "openrlhf_band.integration.objective_loss",
    "make_policy_loss": "openrlhf_band.integration.objective_loss",
    "BandPolicyLoss": "openrlhf_band.integration.policy_loss",
}
__all__ = [
    "BandPolicyLoss",
    "LOSS_AGG_MODES",
    "LOSS_TYPES",
    "ObjectivePolicyLoss",
    "OpenRLHFPolicyLoss",
    "POLICY_LOSSES",
    "loss_entry",
    "add_band_arguments",
    "add_fused_logprobs_argument",
    "add_loss_arguments",
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
    "requests_rollout_log_probs",
    "rollout_anchor_ref",
    "rollout_logprobs_mode",
    "unpad_input",
    "validate_band_arguments",
    "validate_fused_logprobs_arguments",
    "validate_loss_arguments",
]

if TYPE_CHECKING:
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
        requests_rollout_log_probs,
        rollout_anchor_ref,
        rollout_logprobs_mode,
    )
    from openrlhf_band.integration.loss_registry import POLICY_LOSSES, loss_entry
    from openrlhf_band.integration.metrics import band_metrics
    from openrlhf_band.integration.objective_flags import LOSS_TYPES
    from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss, make_policy_loss
    from openrlhf_band.integration.openrlhf_loss import LOSS_AGG_MODES, OpenRLHFPolicyLoss
    from openrlhf_band.integration.policy_loss import BandPolicyLoss


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
