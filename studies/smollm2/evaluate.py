"""Held-out numbers of one policy on the real-model study's tasks (studies/smollm2/run.sh): replies
sampled by vLLM (its CPU build, float32, temperature 1, top_p 1, one engine-level seed) and scored by
the reasoning-gym reward file that trains them.

    python studies/smollm2/evaluate.py MODEL_DIR EVAL_JSONL --out FILE.json [--samples 4] [--seed 0]

- mean_reward: the mean accuracy (the library's scorer, in [0, 1]) over every held-out prompt and
  sample; reward_<task> per task; answer_found: the share of replies with an <answer> tag.
- entropy: the mean negative log-probability of the sampled reply tokens (nats; vLLM's log-prob of
  each sampled token at temperature 1, the end token included). At each position E_x~p[-log p(x)] =
  H(p), so it estimates the policy's mean token entropy over the positions its replies visit; pooled
  over replies of random length it is a ratio estimator (consistent, not unbiased). Unlike the
  learning study's exact entropy it carries sampling noise: entropy_se is its standard error with the
  reply as the unit (tokens of one reply are not independent).
- token_bins: the share of sampled reply tokens whose probability under this policy lies in each bin
  of the band's metrics (p < 0.01, 0.01-0.1, 0.1-0.5, >= 0.5): for the starting model, where a real
  LM's sampled tokens are (docs/smollm2_study.md).
- reply_tokens: the mean reply length; truncated: the share that hit max_tokens without the end token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from openrlhf_band.integration.metrics import _BIN_NAMES, METRIC_PROB_BINS

ROOT = Path(__file__).resolve().parents[2]
REWARD_FILE = ROOT / "openrlhf_band" / "tasks" / "reasoning_gym" / "reward.py"
# the band's metric bins (band/tokens_<bin>): (lo, hi, name), the last one closed at 1
BINS = tuple(zip(METRIC_PROB_BINS[:-1], METRIC_PROB_BINS[1:], _BIN_NAMES))


def _reward_func():
    spec = importlib.util.spec_from_file_location("smollm2_gym_reward", REWARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def _ratio_se(sums: list[float], counts: list[int]) -> float:
    """Standard error of sum(sums) / sum(counts) with the reply as the unit (the delta method for a
    ratio estimator): sqrt(sum((s_i - R n_i)^2) / (m (m - 1))) / mean(n)."""
    m = len(sums)
    if m < 2 or sum(counts) == 0:
        return float("nan")
    ratio = sum(sums) / sum(counts)
    residual = sum((s - ratio * n) ** 2 for s, n in zip(sums, counts))
    return math.sqrt(residual / (m * (m - 1))) / (sum(counts) / m)


def evaluate(model: Path, eval_file: Path, samples: int, seed: int, max_tokens: int) -> dict:
    # vLLM's CPU build sizes its KV cache from this variable (default: most of the machine's memory)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    import vllm
    from transformers import AutoTokenizer

    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in eval_file.read_text().splitlines() if line.strip()]
    chats = [r["prompt"] if isinstance(r["prompt"], list) else [{"role": "user", "content": r["prompt"]}] for r in rows]
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    llm = vllm.LLM(model=str(model), dtype="float32", enforce_eager=True, seed=seed, max_model_len=1024)
    params = vllm.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, n=samples, logprobs=0)
    outputs = llm.generate(prompts, params)

    queries, prompt_of, labels, tasks, nll, lengths, truncated = [], [], [], [], [], [], 0
    reply_nll: list[float] = []  # per reply: the sum of its tokens' negative log-probabilities
    bins = dict.fromkeys((name for _, _, name in BINS), 0)
    for row, prompt, output in zip(rows, prompts, outputs):
        for completion in output.outputs:
            queries.append(prompt + completion.text)
            prompt_of.append(prompt)
            labels.append(row["label"])
            tasks.append(row.get("datasource", "default"))
            lengths.append(len(completion.token_ids))
            truncated += completion.finish_reason == "length"
            reply_nll.append(0.0)
            for token, logprobs in zip(completion.token_ids, completion.logprobs):
                lp = logprobs[token].logprob
                nll.append(-lp)
                reply_nll[-1] -= lp
                p = math.exp(lp)
                name = next(n for lo, hi, n in BINS if lo <= p < hi or (hi == 1.0 and p >= lo))
                bins[name] += 1
    result = _reward_func()(queries, prompt_of, labels)
    scores = [float(v) for v in result["scores"]]
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, score in zip(tasks, scores):
        by_task[task].append(score)
    found = result.get("extra_logs", {}).get("answer_found")
    tokens = len(nll)
    return {
        "model": str(model),
        "eval_file": str(eval_file),
        "prompts": len(rows),
        "samples_per_prompt": samples,
        "seed": seed,
        "max_tokens": max_tokens,
        "mean_reward": statistics.fmean(scores),
        **{f"reward_{task}": statistics.fmean(v) for task, v in sorted(by_task.items())},
        "answer_found": float(found.float().mean()) if found is not None else None,
        "entropy": statistics.fmean(nll),
        "entropy_se": _ratio_se(reply_nll, lengths),
        "reply_tokens": statistics.fmean(lengths),
        "truncated": truncated / len(lengths),
        "tokens": tokens,
        "token_bins": {name: count / tokens for name, count in bins.items()},
        "seconds": round(time.time() - start, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("eval_file", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    result = evaluate(args.model, args.eval_file, args.samples, args.seed, args.max_tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
