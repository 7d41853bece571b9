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


# --- where the loss's pi_old comes from (--actor.band.anchor; docs/training.md#where-the-band-is-centred) ---------
def anchored_on_rollout(args) -> bool:
    """Whether the loss's pi_old is the sampler's log-probs (`--actor.band.anchor rollout`)."""
    return getattr(getattr(args.actor, "band", None), "anchor", None) == "rollout"


def requests_rollout_log_probs(args) -> bool:
    """Whether vLLM returns the log-prob of each token it samples (train_ppo_ray's engine mode and each request's
    `logprobs=1`): OpenRLHF's train/rollout IS correction reads them, the rollout anchor is them, and an objective
    whose ratio is against the sampler (DRPO, IPO) reads them."""
    from openrlhf_band.integration.objective_flags import objective_reads_rollout_log_probs

    return (
        args.algo.advantage.is_correction_level != "off"
        or anchored_on_rollout(args)
        or objective_reads_rollout_log_probs(args)
    )


def rollout_logprobs_mode(args) -> str | None:
    """vLLM's `logprobs_mode` for `create_vllm_engines`, when they are requested: the log-probs after the sampling
    processors, the temperature (the actor divides its logits by the same one) and top-p (which the rollout anchor,
    DRPO and IPO refuse) among them; also OpenRLHF's min_tokens=1, which takes the end-of-sequence token out of a
    reply's first position, where vLLM's log-prob then exceeds the actor's by -log(1 - p_eos)."""
    return "processed_logprobs" if requests_rollout_log_probs(args) else None


def rollout_anchor_ref(args, samples_list, duplicate_factor: int):
    """For `RemoteExperienceMaker.make_experience`: with `--actor.band.anchor rollout`, a Ray object holding each
    micro-batch's rollout log-probs in the layout of the actor's forward results (what `_flatten_results` reads:
    one single-entry list per micro-batch, repeated `duplicate_factor` times), so the experience's
    `action_log_probs`, the loss's pi_old, are the sampler's and the actor's recompute pass is not dispatched.
    None otherwise (the recompute pass runs, as in OpenRLHF)."""
    if not anchored_on_rollout(args):
        return None
    import ray

    return ray.put([[log_probs] for log_probs in rollout_log_probs_of(samples_list) for _ in range(duplicate_factor)])


def rollout_log_probs_of(samples_list) -> list:
    """Each micro-batch's rollout log-probs (B, T-1) as float32, the action mask's shape (natural log; masked
    positions hold what vLLM's executor wrote there, 0.0). Raises RuntimeError when a micro-batch has none (an
    agent executor that does not return them) or a non-finite one inside its action mask: a centre at log-prob
    0 or -inf would train on garbage."""
    import torch

    out = []
    for samples in samples_list:
        log_probs, mask = samples.rollout_log_probs, samples.action_mask
        if log_probs is None:
            raise RuntimeError(
                "--actor.band.anchor rollout: a sample came back without vLLM's log-probs (rollout_log_probs is "
                "None); an agent executor must return them (OpenRLHF's do), or use --actor.band.anchor recomputed"
            )
        if log_probs.shape != mask.shape:
            raise RuntimeError(f"--actor.band.anchor rollout: rollout log-probs {tuple(log_probs.shape)} do not match "
                               f"the action mask {tuple(mask.shape)}")  # fmt: skip
        log_probs = log_probs.float()
        bad = (mask != 0) & ~torch.isfinite(log_probs)
        if bad.any():
            raise RuntimeError(
                f"--actor.band.anchor rollout: {int(bad.sum())} sampled token(s) have a non-finite vLLM log-prob; "
                "the band cannot be centred there (use --actor.band.anchor recomputed)"
            )
        out.append(log_probs)
    return out
