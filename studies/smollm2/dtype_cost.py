"""Why the real-model runs train in float32 on a CPU (the shim's float32_on_cpu): one forward + backward
of SmolLM2-135M-Instruct on the same tokens in float32 and in bfloat16, side by side, best of `--rounds`.

    .venv-e2e/bin/python studies/smollm2/dtype_cost.py [--batch 2 --tokens 64 --rounds 2]

Writes studies/smollm2/results/dtype_cost.json (the ratio is the number; absolute seconds on a shared
machine are noise). OpenRLHF 0.11.2 offers bf16 and fp16 only; a CPU without native bf16 emulates it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def step_seconds(model, ids: torch.Tensor, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".venv-e2e" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "studies" / "smollm2" / "results" / "dtype_cost.json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    ids = torch.randint(100, 40000, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0))
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        model.train()
        seconds[str(dtype).removeprefix("torch.")] = step_seconds(model, ids, args.rounds)
        del model
    flags = (
        Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0]
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    result = {
        "command": "python studies/smollm2/dtype_cost.py "
        f"--batch {args.batch} --tokens {args.tokens} --rounds {args.rounds}",
        "tokens": args.batch * args.tokens,
        "threads": torch.get_num_threads(),
        "seconds": seconds,
        "bf16_over_fp32": seconds["bfloat16"] / seconds["float32"],
        "cpu": platform.processor() or platform.machine(),
        "native_bf16": any(f in flags.split() for f in ("avx512_bf16", "amx_bf16")),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
