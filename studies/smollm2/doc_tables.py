"""The engine study's tables for docs/smollm2_study.md (studies/docs_tables.py renders them): the starting
model, where its sampled tokens are and the first step's clip rates per bin (from results/token_bins.json,
which `study.py first-step` writes), the results after 8 steps (`study.py report`'s paired_table) and the
ledger of finished runs (`study.py ledger`), both from the committed results/runs/*.json."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TOKEN_BINS = RESULTS / "token_bins.json"

sys.path.insert(0, str(HERE.parent))
from paired_runs import markdown_table  # noqa: E402  (the studies' one driver)


def _study():
    """studies/smollm2/study.py under its own name (studies/realmodel/ has a study.py too)."""
    name = "smollm2_study"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "study.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def start_table(start: dict) -> list[str]:
    """The starting model on the held-out split: mean reward, per task, answer tag, reply length, entropy."""
    cells = [f"{start[k]:.3f}" for k in ("mean_reward", "reward_chain_sum", "reward_spell_backward", "answer_found")]
    cells += [f"{start['reply_tokens']:.1f}", f"{start['entropy']:.3f} +- {start['entropy_se']:.3f}"]
    head = ["mean reward", "chain_sum", "spell_backward", "answer tag found", "reply tokens",
            "entropy (sampled-token NLL, nats)"]  # fmt: skip
    return markdown_table(head, [cells])


def bins_table(start: dict) -> list[str]:
    """The share of the starting model's own sampled reply tokens per probability bin."""
    shares = " | ".join(f"{start['token_bins'][b]:.3f}" for b in _study().BIN_NAMES)
    return [
        "| | p < 0.01 | 0.01-0.1 | 0.1-0.5 | >= 0.5 |",  # the corner cell empty, as the page has it
        "|---|---|---|---|---|",
        f"| starting model, its sampled tokens | {shares} |",
    ]


def first_step_table(first_step: dict) -> list[str]:
    """Each method's clip rate per old-probability bin in its first training step, and its clipped share of all
    tokens (train_ppo_ray's ppo_clip_ratio)."""
    rows = []
    for method, row in first_step.items():
        rates = ["-" if row["clip_rate"][b] is None else f"{row['clip_rate'][b]:.4f}" for b in _study().BIN_NAMES]
        rows.append([method, *rates, f"{row['ppo_clip_ratio']:.4f}"])
    head = ["method (first step)", "clip rate p < 0.01", "0.01-0.1", "0.1-0.5", ">= 0.5", "clipped, all tokens"]
    return markdown_table(head, rows)


def start() -> tuple[str, str]:
    return "\n".join(start_table(json.loads(TOKEN_BINS.read_text())["starting_model"])), _shown(TOKEN_BINS)


def token_bins() -> tuple[str, str]:
    return "\n".join(bins_table(json.loads(TOKEN_BINS.read_text())["starting_model"])), _shown(TOKEN_BINS)


def first_step() -> tuple[str, str]:
    return "\n".join(first_step_table(json.loads(TOKEN_BINS.read_text())["first_step"])), _shown(TOKEN_BINS)


def results() -> tuple[str, str]:
    study = _study()
    return study.paired_table(study.ledger_runs(study.LEDGER)), "studies/smollm2/results/runs/*.json"


def ledger() -> tuple[str, str]:
    study = _study()
    return study.ledger_table(study.LEDGER), "studies/smollm2/results/runs/*.json"


def _shown(path: Path) -> str:
    return str(path.relative_to(HERE.parents[1]))


TABLES = {
    "smollm2-start": start,
    "smollm2-token-bins": token_bins,
    "smollm2-first-step": first_step,
    "smollm2-results": results,
    "smollm2-ledger": ledger,
}
