"""The demo's settings, one dataclass: the GRPO loop's (rollouts, prompts x samples, epochs x minibatches,
Adam's lr, the KL coefficient, the evaluation cadence), the band rules' radius and cap, the task's (keys,
answer tokens, the fork and its probabilities, the warm-up) and the run's (seeds, methods, workers, out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openrlhf_band.tools.demo.loop import LoopSettings

# what `make demo` runs: the clip, the kl band, the kl band with the lower floor 0.8, and the
# diagnostic ablation the floor is the training form of (4 methods x 3 seeds, 2 workers; docs/demo.md's timings).
# Names of openrlhf_band.tools.demo.methods.METHODS (which checks them); here so that the settings import nothing
# of the methods, which read these settings.
DEFAULT_METHODS = ["clip", "band-kl", "band-kl-floor", "band-kl+clip-low"]


@dataclass
class DemoConfig:
    """One demo run's settings; the defaults are `make demo`'s (FULL and QUICK: the presets over them)."""

    rollouts: int = 80
    seeds: int = 3
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    workers: int = 2  # parallel runs (processes, one torch thread each)
    prompts_per_rollout: int = 16
    samples_per_prompt: int = 16
    epochs: int = 4
    minibatches: int = 8
    lr: float = 1e-4
    delta: float = 0.05
    upper_cap: float = 10.0
    kl_coef: float = 0.001
    eval_every: int = 5
    eval_prompts: int = 256
    lag: int = 0  # policy versions the sampler lags by (0: samples with the current weights, as `make demo`)
    # task
    keys: int = 128
    answer_tokens: int = 32
    response_len: int = 6
    fork_position: int = 3
    easy_p: float = 0.88
    fork_p_hard: float = 0.05
    fork_p_medium: float = 0.30
    warmup_steps: int = 800
    out: str = "out/demo"

    def early_middle_final(self) -> tuple[int, int, list[int]]:
        """The steps the paired table reports: early, middle, and the last three evaluations."""
        evals = list(range(self.eval_every, self.rollouts + 1, self.eval_every))
        early = min(evals, key=lambda s: abs(s - self.rollouts / 4))
        middle = min(evals, key=lambda s: abs(s - self.rollouts / 2))
        return early, middle, evals[-3:]

    def loop_settings(self) -> LoopSettings:
        """What the GRPO loop reads of these settings (torch's default Adam betas, as the demo has always run)."""
        return LoopSettings(
            rollouts=self.rollouts,
            prompts_per_rollout=self.prompts_per_rollout,
            samples_per_prompt=self.samples_per_prompt,
            epochs=self.epochs,
            minibatches=self.minibatches,
            lr=self.lr,
            kl_coef=self.kl_coef,
            eval_every=self.eval_every,
            sampler_lag=self.lag,
        )
