"""What the patched `ActorPPOTrainer` / `PolicyModelActor` call around the loss: the loss class, its
metrics, and the adaptive radius' inputs, step and checkpoint state (no-ops for any loss but a
`BandPolicyLoss` with an adaptive radius), so the patch lines stay unconditional."""

from __future__ import annotations

from openrlhf_band.integration.loss_registry import aggregation_kwargs, args_entry
from openrlhf_band.integration.openrlhf_loss import OpenRLHFPolicyLoss
from openrlhf_band.integration.policy_loss import BandPolicyLoss

CHECKPOINT_KEY = "openrlhf_band"  # the entry of OpenRLHF's checkpoint client_states


def loss_class_and_kwargs(args, policy_loss_class) -> tuple[type, dict]:
    """The actor's loss class and its extra keyword arguments (beside OpenRLHF's own, which the
    actor passes), from the one registry (`openrlhf_band.integration.loss_registry`, which
    `make_policy_loss` reads too): OpenRLHF's PolicyLoss and none for ppo / gspo; BandPolicyLoss and
    the band's arguments for `--loss band` and for `--loss cispo --actor.cispo.bounds band`;
    ObjectivePolicyLoss and the objective's options for the other registered objectives."""
    entry = args_entry(args)
    if entry.openrlhf:
        return policy_loss_class, {}
    return entry.module(), {**entry.kwargs_from_args(args), **aggregation_kwargs(args)}


def loss_metrics(loss_fn) -> dict:
    """The loss's metrics of its last forward, for `experience.info`: `band/*` of a BandPolicyLoss,
    `<objective>/*` of an ObjectivePolicyLoss, none for OpenRLHF's own."""
    return loss_fn.loss_metrics if isinstance(loss_fn, OpenRLHFPolicyLoss) else {}


def band_loss_inputs(loss_fn, output, action_mask) -> dict:
    """Keyword arguments the loss takes from this training forward: the detached entropy of the
    action tokens (B, A) when its radius adapts to it, else none."""
    if isinstance(loss_fn, BandPolicyLoss) and loss_fn.needs_entropy:
        return {"entropy": output.entropy[:, -action_mask.shape[1] :].detach()}
    return {}


def band_after_step(trainer, step: int) -> None:
    """After a micro-batch of `ActorPPOTrainer.training_step` (`step` is its index in the replay
    buffer): close the band's optimizer step when the weights really moved. Two conditions, each
    needed: OpenRLHF called `optimizer_step` for this micro-batch (with dynamic batching only where
    the replay buffer marks the step: `ppo_actor.py`'s own `is_optimizer_step`), and DeepSpeed applied
    it (`was_step_applied`: false inside a gradient-accumulation window and on a skipped overflow
    step, on all ranks alike). DeepSpeed resets that flag only inside `step()`, so on the dynamic
    path it alone would stay true for every micro-batch after the first real step."""
    loss_fn = trainer.actor_loss_fn
    if not (isinstance(loss_fn, BandPolicyLoss) and loss_fn.needs_entropy):
        return
    if trainer.args.train.dynamic_batch_enable and not trainer.replay_buffer.dynamic_optimizer_step[step]:
        return
    applied = getattr(trainer.actor.model, "was_step_applied", None)
    if applied is None or applied():
        loss_fn.after_optimizer_step()


def band_checkpoint_state(loss_fn) -> dict:
    """The loss's state for a checkpoint's client_states (empty for other losses)."""
    return {CHECKPOINT_KEY: loss_fn.band_state()} if isinstance(loss_fn, BandPolicyLoss) else {}


def band_load_checkpoint_state(loss_fn, checkpoint_states: dict | None) -> None:
    """Restore what `band_checkpoint_state` saved (on resume)."""
    if isinstance(loss_fn, BandPolicyLoss) and checkpoint_states and CHECKPOINT_KEY in checkpoint_states:
        loss_fn.load_band_state(checkpoint_states[CHECKPOINT_KEY])
