"""The docs' API and flag references are the code's: `band_bounds`' signature in docs/operator.md,
`BandPolicyLoss`' options in docs/training.md, the flag and metric tables in docs/training.md only, and
the README's list of example scripts. Each check is shown to fail on a mutated text."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TRAINING = (ROOT / "docs" / "training.md").read_text()


def documented_signature(page: str, name: str) -> str:
    return re.search(rf"\*\*`({name}\(.*?\))`\*\*", page).group(1)


def code_signature(fn) -> str:
    """As the page writes it: `name(a, b="x", *, c=None)`, without annotations."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}".replace("'", '"'))
    return f"{fn.__name__}({', '.join(parts)})"


def test_the_operator_page_gives_band_bounds_signature():
    from openrlhf_band import band_bounds

    page = (ROOT / "docs" / "operator.md").read_text()
    assert documented_signature(page, "band_bounds") == code_signature(band_bounds)
    shorter = page.replace(", lower_floor=None, lower_delta=None)`**", ")`**")
    assert documented_signature(shorter, "band_bounds") != code_signature(band_bounds)


def policy_loss_options() -> set[str]:
    """BandPolicyLoss' own keyword options and the band's (BandSpec's fields, which **band_options takes)."""
    from openrlhf_band import BandSpec
    from openrlhf_band.integration import BandPolicyLoss

    params = inspect.signature(BandPolicyLoss.__init__).parameters.values()
    own = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    return own | {f.name for f in dataclasses.fields(BandSpec)}


def documented_options(page: str) -> set[str]:
    section = page.split("## `BandPolicyLoss`", 1)[1].split("\n## ", 1)[0]
    paragraph = section.split("returns the same", 1)[0]
    return set(re.findall(r"`([a-z_]+)(?:=[^`]*)?`", paragraph))  # `name` or `name=...`


def test_the_training_page_names_every_option_of_band_policy_loss():
    assert policy_loss_options() - documented_options(TRAINING) == set()
    without = TRAINING.replace("`lower_delta`, ", "")
    assert policy_loss_options() - documented_options(without) == {"lower_delta"}


def test_the_flag_and_metric_tables_live_in_the_training_page_only():
    for prefix in ("| `band/", "| `--actor"):
        assert [line for line in TRAINING.splitlines() if line.startswith(prefix)], prefix
        assert not [line for line in README.splitlines() if line.startswith(prefix)], prefix


def expand_braces(word: str) -> list[str]:
    """bash's brace expansion of one word: a_{b,c}_d -> a_b_d, a_c_d (nested braces not needed here)."""
    pieces = re.split(r"\{([^{}]*)\}", word)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(pieces)]
    return ["".join(combo) for combo in itertools.product(*options)]


def scripts_named(text: str) -> set[str]:
    names = set()
    for word in re.findall(r"\w*(?:\{[\w,]*\}\w*)+|\w+", text):  # words, with bash's {a,b} groups
        names.update(expand_braces(word))
    return names


def test_the_readme_names_every_example_script():
    scripts = {p.stem for p in (ROOT / "examples" / "scripts").glob("*.sh")} - {"common"}
    assert scripts - scripts_named(README) == set()
    assert "bandpo_adaptive" not in scripts_named(README.replace("kl_floor,adaptive}", "kl_floor}"))
    assert expand_braces("bandpo_{tv,chi2}") == ["bandpo_tv", "bandpo_chi2"]
