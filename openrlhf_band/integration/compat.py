"""Stand-ins that let the patched OpenRLHF import on machines without its CUDA-only packages.

flash-attn: `ring_attn_utils` needs only pure-torch padding helpers from it; transformers ships
the same functions (ports of flash-attn's), used here. Ring attention itself needs flash-attn.
vLLM: the rollout engines need it; without it `missing_vllm` fails at first use, with a message.
"""

from __future__ import annotations

import torch
from einops import rearrange
from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input

__all__ = ["all_gather", "index_first_axis", "missing_vllm", "pad_input", "rearrange", "unpad_input"]

pad_input = _pad_input  # (total, ...) + indices -> (batch, seqlen, ...)
unpad_input = _unpad_input  # -> (hidden[indices], indices, cu_seqlens, max_seqlen, seqused)


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """flash_attn.bert_padding.index_first_axis: tensor[indices] along dim 0 (a gather)."""
    return tensor[indices]


def all_gather(tensor: torch.Tensor, process_group) -> torch.Tensor:
    raise RuntimeError(
        "ring attention (--ds.ring_attn_size > 1) needs flash-attn, which is not installed here; "
        "install flash-attn==2.8.3 on a CUDA machine"
    )


def vllm_import_error() -> BaseException | None:
    """Why OpenRLHF's imports from vLLM fail here (the exception they raise now), or None if they succeed."""
    try:
        from vllm import SamplingParams  # noqa: F401  (what the patched OpenRLHF modules import)
        from vllm.inputs import TokensPrompt  # noqa: F401
        from vllm.utils import random_uuid  # noqa: F401
    except Exception as error:  # (an OSError or RuntimeError of a broken build already stopped OpenRLHF's import,
        return error  # which catches ImportError only: the user saw it as raised)
    return None


class _MissingVLLM:
    """Takes the place of vllm and its symbols; any use raises one clear error, with the import's own reason:
    not installed, or installed and failing to import (a CUDA, driver or ABI mismatch, shown as it was raised)."""

    def _fail(self, *args, **kwargs):
        reason = vllm_import_error()
        if reason is None:
            raise ImportError(
                "vLLM imports now but did not when OpenRLHF was imported (installed since?): restart the process"
            )
        if isinstance(reason, ModuleNotFoundError) and reason.name == "vllm":
            raise ImportError(
                "vLLM is not installed: OpenRLHF's rollout engines need it. Install vllm==0.29.0 on a GPU "
                "machine (or use the project's Dockerfile); everything else in openrlhf works without it."
            ) from reason
        raise ImportError(
            f"vLLM is installed but OpenRLHF's imports from it fail: {type(reason).__name__}: {reason}. The "
            "rollout engines need it; a mismatch between vLLM, torch, CUDA and the driver is the usual cause "
            "(the image needs an NVIDIA driver >= 580); `python -c 'import vllm'` shows the whole traceback."
        ) from reason

    __call__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()


missing_vllm = _MissingVLLM()
