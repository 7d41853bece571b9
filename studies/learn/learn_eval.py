"""Held-out numbers of one policy on the learning study's task (studies/learn/learn_task.py): what
studies/learn/learn.sh records before and after training, and warmup.sh for the checkpoint.

    python studies/learn/learn_eval.py eval --task DIR --model MODEL_DIR --out FILE.json [--samples 16] [--seed 0]
    python studies/learn/learn_eval.py summary --task DIR --run OUT_DIR --seconds S   (learn.sh, after the run)
    python studies/learn/learn_eval.py watch --run-id ID --out FILE.json              (learn.sh, during it)
    python studies/learn/learn_eval.py record --task DIR --to studies/learn/checkpoint  (commit a rebuilt checkpoint)

- mean_reward: the exact-match rate of replies sampled at temperature 1 (top_p 1, no top_k), `samples`
  per held-out prompt, scored by the task's own reward file; also on hard and medium prompts.
- entropy: the policy's mean token entropy (nats) over those sampled reply tokens (the end token
  included, nothing after it).
- p_correct: the exact probability of the correct reply (the product of its token probabilities,
  the end token included): the expectation of mean_reward, without sampling noise; p_fork_hard: the
  mean probability of the correct fork word on hard prompts, given the correct words before it.

The model is read in float32 from its saved (bf16) weights; sampling uses its own seeded generator,
so two evaluations of the same weights on the same machine give the same numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_task import FORK_POSITION  # noqa: E402

MAX_NEW_TOKENS = 12  # six answer words and the end token fit with room to spare


def _reward_module(task: Path):
    spec = importlib.util.spec_from_file_location("learn_reward", task / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def evaluate(task: Path, model_dir: Path, samples: int = 16, seed: int = 0, batch_prompts: int = 32) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reward = _reward_module(task)
    rows = [json.loads(line) for line in (task / "heldout.jsonl").read_text().splitlines()]
    eos = tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)

    right, hard_flags, entropy_sum, entropy_count = [], [], 0.0, 0
    p_correct, p_fork = [], []
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start : start + batch_prompts]
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                          add_generation_prompt=True)
            for r in batch
        ]  # fmt: skip
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

        # exact: teacher-forced correct reply (its words, then the end token)
        answers = [tokenizer(r["label"], add_special_tokens=False)["input_ids"] + [eos] for r in batch]
        for i, ids in enumerate(answers):
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()]
            seq = torch.cat([prompt_ids, torch.tensor(ids)])[None]
            logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].float(), -1)
            token_logp = logp[len(prompt_ids) - 1 :].gather(-1, torch.tensor(ids)[:, None])[:, 0]
            p_correct.append(float(token_logp.sum().exp()))
            if batch[i]["hard"]:
                p_fork.append(float(token_logp[FORK_POSITION].exp()))

        # sampled: `samples` replies per prompt at temperature 1, token by token with the KV cache
        input_ids = enc["input_ids"].repeat_interleave(samples, 0)
        attention = enc["attention_mask"].repeat_interleave(samples, 0)
        n = len(input_ids)
        position = (attention.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=position, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1].float()
        finished = torch.zeros(n, dtype=torch.bool)
        generated = []
        next_position = position[:, -1:] + 1
        for _ in range(MAX_NEW_TOKENS):
            logp = torch.log_softmax(logits, -1)
            ent = -(logp.exp() * logp).sum(-1)
            entropy_sum += float(ent[~finished].sum())
            entropy_count += int((~finished).sum())
            token = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
            token = torch.where(finished, torch.full_like(token, tokenizer.pad_token_id), token)
            generated.append(token)
            finished = finished | (token == eos)
            if finished.all():
                break
            attention = torch.cat([attention, torch.ones(n, 1, dtype=attention.dtype)], dim=1)
            out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position,
                        past_key_values=past, use_cache=True)  # fmt: skip
            past, logits = out.past_key_values, out.logits[:, -1].float()
            next_position = next_position + 1
        replies = tokenizer.batch_decode(torch.stack(generated, 1), skip_special_tokens=False)
        queries = [texts[i // samples] + reply for i, reply in enumerate(replies)]
        labels = [batch[i // samples]["label"] for i in range(n)]
        scores = reward.reward_func(queries, None, labels)["scores"]
        right += scores.tolist()
        hard_flags += [batch[i // samples]["hard"] for i in range(n)]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    hard_right = [r for r, h in zip(right, hard_flags) if h]
    medium_right = [r for r, h in zip(right, hard_flags) if not h]
    return {
        "mean_reward": mean(right),
        "mean_reward_hard": mean(hard_right),
        "mean_reward_medium": mean(medium_right),
        "entropy": entropy_sum / entropy_count,
        "p_correct": mean(p_correct),
        "p_fork_hard": mean(p_fork),
        "prompts": len(rows),
        "samples_per_prompt": samples,
        "temperature": 1.0,
        "seed": seed,
    }


def summarize(task: Path, run: Path, seconds: float, samples: int = 16, seed: int = 0) -> dict:
    """OUT_DIR/summary.json of learn.sh: before (the checkpoint's numbers, cached by warmup.sh when
    they were made with the same samples and seed), after (the trained model), and the run's
    per-step TensorBoard scalars, seconds per step (median gap between consecutive logged steps)
    and peak memory (the watcher's)."""
    cached = task / "checkpoint_eval.json"
    before = json.loads(cached.read_text()) if cached.exists() else {}
    if (before.get("samples_per_prompt"), before.get("seed")) != (samples, seed):
        before = evaluate(task, task / "checkpoint", samples, seed)
    after = evaluate(task, run / "model", samples, seed)
    scalars, wall = _tensorboard(run / "tensorboard")
    steps = max((max(series) for tag, series in scalars.items() if tag.startswith("train/")), default=0)
    gaps = [b - a for a, b in zip(wall, wall[1:])]
    memory = json.loads((run / "memory.json").read_text()) if (run / "memory.json").exists() else {}
    args_file = run / "args.txt"
    summary = {
        "before": before,
        "after": after,
        "steps": steps,
        "seconds_per_step": statistics.median(gaps) if gaps else None,
        "run_seconds": seconds,
        "peak_pss_gib": memory.get("peak_pss_gib"),
        "train_ppo_ray_args": args_file.read_text().splitlines() if args_file.exists() else [],
        "metrics": {tag: {str(k): v for k, v in sorted(series.items())} for tag, series in sorted(scalars.items())},
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _tensorboard(root: Path) -> tuple[dict[str, dict[int, float]], list[float]]:
    """(every scalar as {tag: {step: value}}, the wall times of the training steps in order: each step's
    latest train/ event)."""
    from openrlhf_band.launcher.results import load_scalar_events

    events = load_scalar_events(root)
    step_wall: dict[int, float] = {}
    for tag, series in events.items():
        if tag.startswith("train/"):
            for step, (wall, _) in series.items():
                step_wall[step] = max(step_wall.get(step, 0.0), wall)
    scalars = {tag: {step: v for step, (_, v) in series.items()} for tag, series in events.items()}
    return scalars, [step_wall[k] for k in sorted(step_wall)]


def _run_pids(run_id: str) -> list[int]:
    marker = f"E2E_RUN_ID={run_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in (Path("/proc") / entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _pss_bytes(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def watch(run_id: str, out: Path, interval_s: float = 1.0) -> None:
    """Sample the summed PSS of every process of the run (those with E2E_RUN_ID=run_id in their
    environment: Ray's daemons and workers, DeepSpeed's ranks, vLLM's engine) until SIGTERM; keep
    the peak in `out`."""
    peak = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        peak = max(peak, sum(_pss_bytes(pid) for pid in _run_pids(run_id)))
        out.write_text(json.dumps({"peak_pss_gib": peak / 2**30, "interval_s": interval_s}) + "\n")
        time.sleep(interval_s)


RECORD_COMMAND = "LEARN_REBUILD=1 bash studies/learn/warmup.sh DIR (train_sft on DIR/sft.jsonl, then the held-out eval)"


def record(task: Path, to: Path) -> dict:
    """Copy the checkpoint warmup.sh made in `task` (LEARN_REBUILD=1: train_sft's) to `to`, the committed
    folder, with MADE.json: the command, the task version, the sha256 of every file, the held-out numbers
    (task/checkpoint_eval.json) and the CPU flags that decide its bf16 arithmetic."""
    import hashlib
    import shutil

    from learn_task import TASK_VERSION

    if (task / "VERSION").read_text().strip() != TASK_VERSION:
        raise SystemExit(f"{task} is not a finished warm-up of task version {TASK_VERSION}")
    if not (task / "sft.log").exists():
        raise SystemExit(f"{task} holds a copy of the committed checkpoint: make one with LEARN_REBUILD=1 first")
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(task / "checkpoint", to)
    from cpu_dtype import cpu_flags  # studies/cpu_engine, on sys.path through learn_task

    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    made = {
        "command": RECORD_COMMAND,
        "task_version": TASK_VERSION,
        "sha256": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(to.iterdir()) if f.is_file()},
        "heldout": json.loads((task / "checkpoint_eval.json").read_text()),
        "cpu_bf16_flags": sorted(set(flags) & {"avx512_bf16", "amx_bf16", "avx512f", "avx2"}),
    }
    (to / "MADE.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("eval", help="held-out numbers of one model")
    one.add_argument("--model", type=Path, required=True, help="a Hugging Face model directory")
    one.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    summary = sub.add_parser("summary", help="learn.sh's OUT_DIR/summary.json")
    summary.add_argument("--run", type=Path, required=True, help="learn.sh's OUT_DIR")
    summary.add_argument("--seconds", type=float, required=True, help="the run's wall time")
    for p in (one, summary):
        p.add_argument("--task", type=Path, required=True, help="the task directory (warmup.sh's DIR)")
        p.add_argument("--samples", type=int, default=16, help="replies per held-out prompt (>= 8)")
        p.add_argument("--seed", type=int, default=0)
    watcher = sub.add_parser("watch", help="peak memory of a run's processes")
    watcher.add_argument("--run-id", required=True)
    watcher.add_argument("--out", type=Path, required=True)
    recorder = sub.add_parser("record", help="commit a rebuilt warm-up checkpoint with its record (MADE.json)")
    recorder.add_argument("--task", type=Path, required=True, help="warmup.sh's DIR, made with LEARN_REBUILD=1")
    recorder.add_argument("--to", type=Path, required=True, help="the committed folder: studies/learn/checkpoint")
    args = parser.parse_args()
    if args.command == "watch":
        watch(args.run_id, args.out)
        return 0
    if args.command == "record":
        print(json.dumps(record(args.task, args.to)["heldout"]))
        return 0
    if args.samples < 8:
        parser.error("--samples must be at least 8")
    torch.set_num_threads(2)
    if args.command == "eval":
        result = evaluate(args.task, args.model, args.samples, args.seed)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
    else:
        result = summarize(args.task, args.run, args.seconds, args.samples, args.seed)
        print(json.dumps({k: result[k] for k in ("before", "after", "steps", "seconds_per_step", "peak_pss_gib")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
