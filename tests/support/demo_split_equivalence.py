"""The demo split into a package (c82b186): the old openrlhf_band/tools/demo.py (from git, at 4f63a9a) against
the new package, bit for bit on small runs of every kind of method (clip, band, entropy-adaptive floor, DPPO, DCPO, an
objective without bounds, the ablation), the warm-up and the mechanism check. Run from the checkout:

    OMP_NUM_THREADS=1 .venv/bin/python tests/support/demo_split_equivalence.py   (from the checkout, with git history)

(about a minute on one core). Prints OK or raises with the first difference."""

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

old_source = subprocess.run(["git", "show", "4f63a9a:openrlhf_band/tools/demo.py"], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
path = Path(tempfile.mkdtemp()) / "demo_before.py"
path.write_text(old_source)
spec = importlib.util.spec_from_file_location("demo_before", path)
old = importlib.util.module_from_spec(spec)
sys.modules["demo_before"] = old
spec.loader.exec_module(old)

from openrlhf_band.tools import demo as new  # noqa: E402

assert old.METHODS == new.METHODS and old.DEFAULT_METHODS == new.DEFAULT_METHODS
assert old.FULL == new.FULL and old.QUICK == new.QUICK and old.BINS == new.BINS

small = dict(warmup_steps=30, rollouts=4, eval_every=2, eval_prompts=32, prompts_per_rollout=4, samples_per_prompt=4,
             epochs=2, minibatches=4)  # fmt: skip
cfg_old, cfg_new = old.DemoConfig(**small), new.DemoConfig(**small)

actor = old.build_actor(cfg_old, 0)
old.warm_up(actor, cfg_old, 0)
model = new.build_model(cfg_new, 0)
new.warm_up(model, cfg_new, 0)
state_old, state_new = actor.model.state_dict(), model.state_dict()
assert list(state_old) == list(state_new)
assert all(torch.equal(state_old[k], state_new[k]) for k in state_old), "warm-up differs"
state = {k: v.clone() for k, v in state_new.items()}

for method in ("clip", "band-kl", "band-kl-floor", "band-kl-entropy-floor", "dppo-tv", "dcpo", "sapo", "cispo",
               "band-kl+clip-low", "band-kl-cispo"):  # fmt: skip
    rows_old = old.train_method(method, 0, state, cfg_old)
    rows_new = new.train_method(method, 0, state, cfg_new)
    assert json.dumps(rows_old) == json.dumps(rows_new), (method, rows_old, rows_new)  # NaN-safe, exact floats
    print(method, "identical:", len(rows_new), "rows")

m_old = old.mechanism_check(cfg_old, state, max_updates=100)
m_new = new.mechanism_check(cfg_new, state, max_updates=100)
assert json.dumps(m_old) == json.dumps(m_new), (m_old, m_new)
rows = new.train_method("clip", 0, state, cfg_new) + new.train_method("band-kl", 0, state, cfg_new)
cfg_old.methods = cfg_new.methods = ["clip", "band-kl"]
start = {k: rows[0][k] for k in ("mean@32", "mean@32_hard", "pass@32", "entropy", "p_fork_hard")}
assert old.format_summary(rows, cfg_old, start, m_old) == new.format_summary(rows, cfg_new, start, m_new)
print("OK: rows, warm-up, mechanism check and summary identical")
