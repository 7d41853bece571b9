"""Start-up noise from third-party packages that says nothing about the user's input, silenced by
exact message (every other warning and error still shows):

- pynvml: "The pynvml package is deprecated" (a FutureWarning on every `import torch` where OpenRLHF's
  pin `pynvml>=12` is installed beside nvidia-ml-py);
- bitsandbytes: "Failed to load CPU gemm_4bit_forward from kernels-community" (an optional CPU 4-bit
  kernel, logged when transformers imports it; nothing here quantizes);
- DeepSpeed: "Setting accelerator to CPU ..." (its accelerator auto-detection on a machine without GPU).
"""

from __future__ import annotations

import logging
import os
import warnings

# The same filter in -W syntax (a literal, case-insensitive prefix of the message): put in
# PYTHONWARNINGS, so that processes started from this one apply it before their own `import torch`
# (the demo's spawned workers and the benchmarks' subprocesses import torch at module top).
PYNVML_WARNING_FILTER = "ignore:The pynvml package is deprecated:FutureWarning"

_SILENCED_LOG_MESSAGES = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "DeepSpeed": "Setting accelerator to CPU",
}


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_third_party_startup() -> None:
    """Install the filters; call before the packages are imported (the loggers keep the filters).
    Also extends PYTHONWARNINGS in this process's environment, which child processes inherit."""
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
    inherited = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    if PYNVML_WARNING_FILTER not in inherited:
        os.environ["PYTHONWARNINGS"] = ",".join([*inherited, PYNVML_WARNING_FILTER])
    for logger_name, prefix in _SILENCED_LOG_MESSAGES.items():
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropMessage) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropMessage(prefix))
