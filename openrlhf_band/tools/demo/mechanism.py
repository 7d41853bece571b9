"""The mechanism the demo is built around, checked on its own: from the warm-up checkpoint, how far the
rare correct fork token (p ~ 0.1, advantage +1) may rise in one update under clip 0.2 (to 1.2 p) and under
the kl band (to r_up(p) p), and the one line the summary prints of it.
"""

from __future__ import annotations

import torch

from openrlhf_band.tools.demo.config import DemoConfig
from openrlhf_band.tools.demo.task import _vocab, build_actor, correct_response


def mechanism_check(cfg: DemoConfig, warm_state: dict, seed: int = 0, step: float = 0.005, max_updates: int = 2000):
    """One update from the warm-up checkpoint: how far the rare correct fork token of a hard prompt,
    with advantage +1, may rise under clip 0.2 and under the kl band. Each step moves the weights
    along the loss gradient by just enough to raise log p by `step` (first order), until the bound
    takes the gradient away: so the rise stops within one small step past the bound, about 1.2
    under clip and about r_up(p) under the band. (Plain optimizer steps would overshoot by the last
    step's size, which grows with the ratio.) Returns p_old, each method's ratio and upper bound."""
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.band.bounds import band_bounds
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    torch.set_num_threads(1)
    key0, hard_token, _, _ = _vocab(cfg)
    prompt = torch.tensor([[0, key0 + 3, hard_token]])
    correct = correct_response(torch.tensor([3]), cfg)
    sequences = torch.cat([prompt, correct[:, : cfg.fork_position + 1]], dim=1)  # up to the fork token
    action_mask, advantages = torch.ones(1, 1), torch.ones(1, 1)
    attention_mask = torch.ones_like(sequences)
    warm = build_actor(cfg, seed)
    warm.model.load_state_dict(warm_state)
    warm.eval()
    with torch.no_grad():
        old = warm(sequences, action_mask, attention_mask=attention_mask)
    result = {"p_old": old.exp().item()}
    losses = {
        "clip": PolicyLoss(0.2, 0.2),
        "band-kl": BandPolicyLoss(divergence="kl", delta=cfg.delta, upper_cap=cfg.upper_cap, backend="torch"),
    }
    for name, loss_fn in losses.items():
        actor = build_actor(cfg, seed)
        actor.model.load_state_dict(warm_state)
        actor.eval()  # no dropout: the same function at every step
        params = [p for p in actor.model.parameters() if p.requires_grad]
        for _ in range(max_updates):
            new = actor(sequences, action_mask, attention_mask=attention_mask)
            loss = loss_fn(new, old, advantages, action_mask=action_mask)[0]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            norm2 = sum(float((g * g).sum()) for g in grads if g is not None)
            if norm2 == 0.0:  # clipped: the bound took the gradient away
                break
            ratio = float((new - old).detach().exp())
            with torch.no_grad():  # grad = -r grad(log p), so this step raises log p by `step` to first order
                for p, g in zip(params, grads):
                    if g is not None:
                        p.sub_(g, alpha=step * ratio / norm2)
        with torch.no_grad():
            result[f"ratio_{name}"] = (actor(sequences, action_mask, attention_mask=attention_mask) - old).exp().item()
    result["bound_clip"] = 1.2
    result["bound_band-kl"] = band_bounds(old, "kl", cfg.delta, upper_cap=cfg.upper_cap)[1].item()
    return result


def format_mechanism(m: dict[str, float]) -> str:
    return (
        f"one update from the warm-up checkpoint, the rare correct fork token (p = {m['p_old']:.3f}), advantage +1: "
        f"rises x{m['ratio_clip']:.2f} under clip 0.2 (bound 1.2), x{m['ratio_band-kl']:.2f} under the kl band "
        f"(bound {m['bound_band-kl']:.2f})"
    )
