"""Every example script dry-runs through the patched OpenRLHF parser (check-args), and only the
method flags differ between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"
# the scripts call `python3` and `openrlhf-band`: those of this interpreter's environment
BASE_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
EXPECTED = {
    "bandpo_kl.sh": ("band", {"rule": "trust_region", "divergence": "kl", "delta": 0.05, "upper_cap": 10.0}),
    "bandpo_tv.sh": ("band", {"rule": "trust_region", "divergence": "tv", "delta": 0.05, "upper_cap": 10.0}),
    "bandpo_chi2.sh": ("band", {"rule": "trust_region", "divergence": "chi2", "delta": 0.05, "upper_cap": 10.0}),
    "bandpo_adaptive.sh": ("band", {"rule": "trust_region", "divergence": "kl", "delta": 0.05, "upper_cap": 10.0}),
    "grpo_clip.sh": ("ppo", None),
    "clip_higher.sh": ("ppo", None),
    "dcpo.sh": ("band", {"rule": "dcpo", "upper_cap": 10.0, "dcpo_eps": [0.16, 0.2]}),
}


def dry_run(script: str, tmp_path: Path) -> dict:
    env = {
        **BASE_ENV,
        "DRY_RUN": "1",
        "MODEL": "/models/some-model",
        "DATA_DIR": str(tmp_path),
        "PYTHONWARNINGS": "ignore",
    }
    done = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.index("{") :])


def test_every_script_is_covered():
    assert {p.name for p in SCRIPTS.glob("*.sh")} - {"common.sh"} == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_dry_run_validates_with_the_patched_parser(script, tmp_path):
    config = dry_run(script, tmp_path)
    loss, band = EXPECTED[script]
    assert config["policy_loss_type"] == loss
    # the paper's shared settings
    assert config["advantage_estimator"] == "group_norm"
    assert config["loss_agg_mode"] == "seq-mean-token-mean"
    assert config["kl_loss"] == {"use_loss": True, "estimator": "k3", "init_coef": 0.001}
    assert config["entropy_coef"] == 0.0 and config["dual_clip"] == 10.0
    if band is None:
        assert "band" not in config
    else:
        assert {k: config["band"][k] for k in band} == band
    if script == "bandpo_adaptive.sh":
        assert config["band"]["adaptive"]["rule"] == "entropy" and config["band"]["adaptive"]["entropy_power"] == 1.0
    elif band is not None and band["rule"] == "trust_region":
        assert config["band"]["adaptive"] is None
    if script == "clip_higher.sh":
        assert config["eps_clip_low_high"] == [0.2, 0.28]
    if band is not None:  # the band ignores the clip eps, so they are not shown
        assert "eps_clip_low_high" not in config
    # no flash-attn in this environment: SDPA without packing (common.sh's detection)
    assert config["attention"] == {"implementation": "sdpa", "packing_samples": False}


def test_a_bad_extra_flag_fails_the_dry_run(tmp_path):
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "EXTRA_ARGS": "--band_delta -1"}
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0 and "delta must be a positive finite number" in done.stderr


def test_attn_override_turns_packing_on_with_flash_attention(tmp_path, monkeypatch):
    monkeypatch.setitem(BASE_ENV, "ATTN", "flash_attention_2")
    config = dry_run("bandpo_kl.sh", tmp_path)
    assert config["attention"] == {"implementation": "flash_attention_2", "packing_samples": True}
