"""`--ds.fused_logprobs`: OpenRLHF's `Actor.forward` without its [batch, seq, vocab] float32 logits.

OpenRLHF 0.11.2 takes the model's full logits, casts them to float32, divides by the temperature and
only then gathers the sampled tokens' log-probs (and the entropy). With the flag, the lm_head module
itself computes the log-probs (and the entropy where OpenRLHF asks for it) through
`openrlhf_band.ops.fused_linear_logprobs`, chunk by chunk, and returns them in place of the logits:
a [batch, seq, 1 or 2] float32 tensor. The rest of `Actor.forward` (packing, ring attention's
gather and pad, the shift, the action mask) is unchanged.

Why inside lm_head's own forward: under DeepSpeed ZeRO-3 the lm_head weight is partitioned and
gathered only by that module's pre-forward hook (and again by its pre-backward hook), and the
engine's output hooks must see what the loss is computed from. Computing from hidden states after
`self.model(...)` returned would find an empty partition and bypass both. The model is called exactly
as before; only what its lm_head returns changes, and only while `Actor.forward` asks for it (a
generation, a save or any other caller of the module gets the plain linear layer).

What it refuses, at `Actor` construction with a one-line reason (never a silent fallback): a VLM, an
lm_head that is not a plain `torch.nn.Linear` (LoRA on the head, a tensor-parallel head), and models
whose logits are changed after lm_head (soft-capping, logit scaling): the fused path would compute
other log-probs than the model's. Flags that cannot combine with it are refused at parse time
(`validate_fused_logprobs_arguments`).

With `--ds.use_liger_kernel` (Liger's model classes: fused RMSNorm, RoPE, SwiGLU; its
`lce_forward` still returns full logits when no labels are passed, as OpenRLHF never passes them)
the two combine: Liger's forward calls `self.lm_head(...)`, which is this module.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

FLAG = "--ds.fused_logprobs"
# config attributes of models whose logits are changed after lm_head (transformers 5.x): the fused
# path would compute the log-probs of other logits than the model returns
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def add_fused_logprobs_argument(parser: argparse.ArgumentParser) -> None:
    """`--ds.fused_logprobs` for `train_ppo_ray` (default off: OpenRLHF's released forward)."""
    group = parser.add_argument_group("openrlhf-band: memory")
    group.add_argument(
        FLAG, action="store_true", default=False,
        help="compute the actor's and the reference model's action log-probs (and the entropy) from the hidden "
        "states in chunks inside lm_head (openrlhf_band.ops.fused_linear_logprobs): no [batch, seq, vocab] float32 "
        "logits; same numbers as OpenRLHF's forward within float32 rounding",
    )  # fmt: skip


def validate_fused_logprobs_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Refuse, at parse time, the flags the fused path cannot honour (one line, exit status 2)."""
    from openrlhf_band.integration.parser_errors import OneLineErrors

    if not getattr(args.ds, "fused_logprobs", False):
        return
    parser = OneLineErrors(parser)
    conflicts = []
    if getattr(args.ds, "tensor_parallel_size", 1) > 1:
        conflicts.append("--ds.tensor_parallel_size > 1 (a tensor-parallel lm_head holds a shard of the vocabulary)")
    if getattr(args.ds, "deepcompile", False):
        conflicts.append("--ds.deepcompile (not tested with a replaced lm_head forward)")
    lora = getattr(getattr(args.ds, "lora", None), "rank", 0) or 0
    targets = getattr(getattr(args.ds, "lora", None), "target_modules", None) or []
    if lora > 0 and "lm_head" in (targets if isinstance(targets, list) else [targets]):
        conflicts.append("LoRA on lm_head (--ds.lora.target_modules lm_head: the head is no plain linear layer)")
    if (getattr(getattr(args, "data", None), "max_images_per_prompt", 0) or 0) > 0:
        conflicts.append("a vision-language model (--data.max_images_per_prompt > 0)")
    if conflicts:
        parser.error(f"{FLAG} does not support {conflicts[0]}: drop one of the two")


def fused_logprobs_config(args) -> bool:
    """What `check-args` reports for the flag: whether the run uses the fused head."""
    return bool(getattr(args.ds, "fused_logprobs", False))


@dataclass
class _Request:
    labels: Tensor  # (B, S) next-token ids, as Actor.forward rolls them
    temperature: float
    entropy: bool


class FusedHead:
    """The lm_head of one model, computing log-probs (and entropy) in place of logits on request."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if type(head) is not nn.Linear:  # a subclass (LoRA, tensor-parallel) computes something else
            raise ValueError(
                f"{FLAG}: the model's lm_head is {type(head).__name__}, not a plain torch.nn.Linear: not supported"
            )
        config = getattr(model, "config", None)
        for name in _LOGIT_TRANSFORMS:
            value = getattr(config, name, None)
            if value not in (None, 0, 0.0, 1, 1.0):
                raise ValueError(f"{FLAG}: the model changes its logits after lm_head ({name}={value!r}): unsupported")
        self.head, self.temperature = head, float(temperature)
        self.request: _Request | None = None
        self._plain_forward = head.forward
        head.forward = self._forward  # an instance attribute: nn.Module.__call__ (and ZeRO-3's hooks) run it

    def _forward(self, hidden: Tensor) -> Tensor:
        request = self.request
        if request is None:
            return self._plain_forward(hidden)
        from openrlhf_band.ops.fused_logprobs import fused_linear_logprobs

        if hidden.shape[:-1] != request.labels.shape:
            raise RuntimeError(
                f"{FLAG}: lm_head got hidden states of shape {tuple(hidden.shape)} for labels of shape "
                f"{tuple(request.labels.shape)} (a model that keeps only some positions is not supported)"
            )
        out = fused_linear_logprobs(
            hidden, self.head.weight, request.labels, bias=self.head.bias, temperature=request.temperature,
            return_entropy=request.entropy,
        )  # fmt: skip
        columns = out if request.entropy else (out,)
        return torch.stack(columns, dim=-1)

    @contextlib.contextmanager
    def computing(self, labels: Tensor, entropy: bool) -> Iterator[None]:
        """While inside, the head returns [log p(label), entropy] (or [log p]) per position."""
        self.request = _Request(labels, self.temperature, entropy)
        try:
            yield
        finally:
            self.request = None


class FusedForward:
    """One `Actor.forward` call's use of the fused head: `with it:` around the model call, then
    `log_probs` / `entropy` (B, S) float32 instead of OpenRLHF's gather from the logits. Inactive (a
    no-op, OpenRLHF's path) without the flag or where the caller wants the logits themselves."""

    def __init__(self, actor: nn.Module, labels: Tensor, entropy: bool, wants_logits: bool) -> None:
        head: FusedHead | None = getattr(actor, "fused_head", None)
        self.active = head is not None and not wants_logits
        self._context = head.computing(labels, entropy) if self.active else contextlib.nullcontext()
        self._entropy = entropy
        self.log_probs = self.entropy = None

    def __enter__(self) -> FusedForward:
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def take(self, output) -> None:
        """Read the head's columns out of the model's output (whose "logits" they replaced)."""
        if not self.active:
            return
        columns = output["logits"]
        self.log_probs = columns[..., 0]
        if self._entropy:
            self.entropy = columns[..., 1]
        # nothing of vocabulary size is kept alive by `output`; an empty float32 tensor rather than None,
        # so that Actor.forward's own cast and temperature lines run unchanged (on nothing)
        output["logits"] = columns.new_empty(0)


def install_fused_head(actor: nn.Module, enabled: bool) -> None:
    """Called at the end of `Actor.__init__`: with `--ds.fused_logprobs`, give its model a FusedHead."""
    actor.fused_head = None
    if not enabled:
        return
    if getattr(actor, "is_vlm", False):
        raise ValueError(f"{FLAG}: vision-language models are not supported")
    actor.fused_head = FusedHead(actor.model, getattr(actor, "temperature", 1.0))


def fused_forward(actor: nn.Module, labels: Tensor, entropy: bool, action_mask, return_logprobs: bool,
                  allgather_logits: bool) -> FusedForward:  # fmt: skip
    """The `FusedForward` of one `Actor.forward` call (see there for the arguments)."""
    wants_logits = (action_mask is None and not return_logprobs) or allgather_logits
    return FusedForward(actor, labels, entropy, wants_logits)
