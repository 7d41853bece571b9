"""Every example script's check-args JSON (DRY_RUN=1), dry-run as tests/launcher/test_examples.py does, plus the
launcher's TASK= variants and the code agent's, with the data directory written <DATA_DIR>:

    python tests/support/check_args_capture.py OUT.json      (with the checkout's environment)

tests/fixtures/unchanged/check_args_at_4f63a9a.json is its output at 4f63a9a, before the tasks moved into folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout this file is in
SCRIPTS = ROOT / "examples" / "scripts"


def capture() -> dict[str, dict]:
    """{"SCRIPT[ NAME=VALUE...]": its check-args JSON}."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DRY_RUN": "1",
        "MODEL": "/models/some-model",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(ROOT),
    }
    for name in ("LOWER_FLOOR", "FUSED_LOGPROBS"):  # as dry_run: the scripts' own values
        env.pop(name, None)
    cases = [(p.name, {}) for p in sorted(SCRIPTS.glob("*.sh")) if p.name != "common.sh"]
    cases += [("bandpo_kl.sh", {"TASK": task}) for task in ("reasoning-gym", "code", "mc")]
    cases += [("bandpo_kl.sh", {"TASK": "code", "AGENT": "1", "ASYNC": "1"})]
    out = {}
    for script, extra in cases:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, cwd=ROOT,
                                  env={**env, "DATA_DIR": tmp, **extra}, timeout=600)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{script} {extra}: exit {done.returncode}\n{done.stderr[-2000:]}")
            name = script + "".join(f" {k}={v}" for k, v in extra.items())
            out[name] = json.loads(done.stdout.replace(tmp, "<DATA_DIR>"))
    return out


if __name__ == "__main__":
    result = capture()
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} dry runs")
