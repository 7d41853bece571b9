"""How far apart two float32 computations of the same lm_head log-probs, entropy and gradients may be.

OpenRLHF's forward (full logits, `log_probs_from_logits`, `compute_entropy`, autograd) and
`--ds.fused_logprobs` (chunks of tokens, an explicit backward formula) compute the same exact
quantities in another order. Neither is bitwise stable across CPUs: another SIMD width or GEMM
blocking sums in another order. So a test holds their difference to the sum of each path's
forward-error bound, which holds for every summation order and blocking (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eq. 3.5 / Lemma 3.1): a float32 dot product or sum of
n terms has

    |fl(sum_k x_k y_k) - sum_k x_k y_k| <= gamma_n * sum_k |x_k y_k|,   gamma_n = n u / (1 - n u),

with u = 2**-24, and an elementwise op adds at most a few u relative (exp / log / softmax within
2 ulp in torch's vectorised and scalar paths alike). Both paths are within the bound of the exact
value, so their difference is within twice it. Bounds are to first order in u: every relative
error here is below 1e-4, so the neglected second-order terms are below 1e-4 of the bound.

The bounds are computed in float64 from the float32 inputs (hidden states, weight, labels) and
upper bounds of the upstream gradients, per element: a real defect (a dropped chunk, a scaled
gradient, a wrong temperature) changes values by far more than rounding, which the tests show with
negative controls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32
# Elementwise roundings one path spends per logit after the GEMM (the division by T, the
# subtraction of lse, exp, the products and sums of the backward formula, the cast): counted
# generously for either path (autograd's log_softmax / entropy backward and the fused formula).
ELEMENTWISE_ROUNDINGS = 8


def gamma(n: int) -> float:
    """Higham's gamma_n for float32: the relative bound of an n-term sum, whatever its order."""
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


@dataclass(frozen=True)
class HeadBounds:
    """Elementwise bounds on |path A - path B|, float64: log_probs / entropy (N,), d_hidden (N, H),
    d_weight (V, H)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    d_hidden: torch.Tensor
    d_weight: torch.Tensor


def lm_head_bounds(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    grad_log_probs_max: float,
    grad_entropy_max: float,
    model_unit_roundoff: float = UNIT_ROUNDOFF,
) -> HeadBounds:
    """Bounds on the difference of two float32 evaluations of log p(label), entropy and their
    gradients through `logits = hidden @ weight.T / temperature`.

    Args:
        hidden: (..., H) float32 inputs of the head, as the model produced them.
        weight: (V, H) float32 head weight.
        labels: (...) token ids, the shape of hidden without its last dimension.
        temperature: T, the logits' divisor.
        grad_log_probs_max: an upper bound of |d loss / d log p| over every token (0 if unused).
        grad_entropy_max: an upper bound of |d loss / d entropy| over every token (0 if unused).
        model_unit_roundoff: the unit roundoff of the model's dtype, in which the head's GEMMs round
            their outputs (logits, d hidden, d W) and its logits' gradient is cast (2**-8 for bf16);
            the GEMMs accumulate in float32 either way.
    """
    h = hidden.detach().double().reshape(-1, hidden.shape[-1])
    w = weight.detach().double()
    y = labels.reshape(-1)
    n_tokens, n_hidden = h.shape
    n_vocab = w.shape[0]
    u, g_max, e_max = UNIT_ROUNDOFF, float(grad_log_probs_max), float(grad_entropy_max)
    um = max(float(model_unit_roundoff), u)

    z = h @ w.T / temperature
    # logits: an H-term dot product rounded to the model's dtype, then the division by T (one rounding)
    dz = gamma(n_hidden) * (h.abs() @ w.abs().T) / temperature + (um + u) * z.abs()
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    # zeta bounds each of: max_j dz_j, the error of lse (the logits' error plus a V-term sum, exp and
    # log), and the rounding of z_j - lse; so the relative error of p_j = exp(z_j - lse) is <= 3 zeta
    zeta = dz.amax(-1) + gamma(n_vocab + ELEMENTWISE_ROUNDINGS) * (1 + z.abs().amax(-1) + lse.abs())
    rel_p = (3 * zeta)[:, None]
    abs_pz = (p * z.abs()).sum(-1)
    s = (p * z).sum(-1)  # sum_j p_j z_j
    ds = (p * (rel_p * z.abs() + dz)).sum(-1) + gamma(n_vocab) * abs_pz  # error of s
    entropy = lse - s

    log_probs = z.gather(1, y[:, None]).squeeze(1) - lse
    log_probs_err = 3 * zeta + u * log_probs.abs()
    entropy_err = 2 * zeta + ds + gamma(n_vocab + 2) * (abs_pz + entropy.abs())

    # d loss / dz_j = g (onehot_j - p_j) - e p_j (z_j - s); a: the magnitude of its terms
    onehot = torch.zeros_like(p).scatter_(1, y[:, None], 1.0)
    a = g_max * (onehot + p) + e_max * p * (z.abs() + s.abs()[:, None])
    dgz = (rel_p + ELEMENTWISE_ROUNDINGS * u) * a + e_max * p * (dz + ds[:, None])
    # through z = logits / T: one more rounding, then the cast to the model's dtype
    da_mag, dda = a / temperature, dgz / temperature + (u + um) * a / temperature
    # d hidden = da @ W: a V-term dot product per element; d W = da^T @ hidden: an N-term sum over
    # tokens, whatever the chunking (a sum of chunk sums is one order of the same N terms)
    # (each rounded to the model's dtype once: its output, or a running sum per chunk, of at most
    # ceil(N / 128) chunks at the automatic chunk size, here counted as N roundings)
    d_hidden_err = dda @ w.abs() + (gamma(n_vocab) + um) * (da_mag @ w.abs())
    weight_terms = da_mag.T @ h.abs()
    d_weight_err = dda.T @ h.abs() + (gamma(n_tokens) + (um if um == u else n_tokens * um)) * weight_terms
    return HeadBounds(2 * log_probs_err, 2 * entropy_err, 2 * d_hidden_err, 2 * d_weight_err)


def excess(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> float:
    """max |actual - expected| / bound over all elements (<= 1: within the bound)."""
    diff = (actual.detach().double().reshape(bound.shape) - expected.detach().double().reshape(bound.shape)).abs()
    return float((diff / bound.clamp_min(torch.finfo(torch.float64).tiny)).max())


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> float:
    """Every element within its bound; returns the largest |difference| / bound for the record."""
    ratio = excess(actual, expected, bound)
    assert ratio <= 1.0, f"{what}: |difference| reaches {ratio:.3g} x its float32 rounding bound"
    return ratio
