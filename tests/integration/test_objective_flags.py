"""The registered objectives through the patched train_ppo_ray parser and the actor's wiring: their
flags (verl's names and defaults), the parse-time refusals (one line, exit status 2), what the
patched actor builds for each `--actor.policy_loss_type` (`loss_class_and_kwargs`, the same modules
as `make_policy_loss`), and OpenRLHF's options that each objective does or does not take."""

from __future__ import annotations

import math

import pytest
import torch

from openrlhf_band.integration.flags import resolved_loss_config
from openrlhf_band.integration.hooks import loss_class_and_kwargs, loss_metrics
from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss, make_policy_loss
from openrlhf_band.integration.policy_loss import BandPolicyLoss
from openrlhf_band.objectives import OBJECTIVES, ObjectiveLoss, get_objective, register_objective
from openrlhf_band.patching.check_args import validate_train_args

BASE = [
    "--actor.model_name_or_path", "some/model", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "reward.py",
]  # fmt: skip
# verl 0.9.1's config defaults (verl/trainer/config/actor/actor.yaml) for each option
VERL_DEFAULTS = {
    "cispo": {"bounds": "fixed"},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    "gmpo": {},
    "clip_cov": {"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},
    "gpg": {},
    # not verl's: their authors' defaults (UniRL's DRPOConfig, prime-rl's IPOLossConfig; objectives/sampler.py)
    "drpo": {"epsilon": 12.5, "old_logp_source": "rollout"},
    "ipo": {"ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 0.001},
}


def build(*extra: str):
    """The patched parser's arguments and the loss module the patched actor builds from them."""
    from openrlhf.models.loss import PolicyLoss

    args = validate_train_args([*BASE, *extra])
    loss_class, kwargs = loss_class_and_kwargs(args, PolicyLoss)
    module = loss_class(
        **kwargs,
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )  # as the patched ActorPPOTrainer builds it (openrlhf/trainer/ray/ppo_actor.py)
    return args, module


def test_every_registered_objective_is_covered_here():
    assert set(OBJECTIVES) == set(VERL_DEFAULTS)


@pytest.mark.parametrize("name", sorted(VERL_DEFAULTS))
def test_defaults_are_verls_and_the_actor_builds_the_objective(name):
    args, module = build("--loss", name)
    assert type(module) is ObjectivePolicyLoss and module.policy_loss_type == name
    assert module.options == VERL_DEFAULTS[name]
    assert {o.name: o.default for o in get_objective(name).options} == VERL_DEFAULTS[name]
    config = resolved_loss_config(args)
    assert config["objective"]["options"] == VERL_DEFAULTS[name] and "band" not in config


def test_option_flags_reach_the_module_by_their_verl_names():
    _, module = build("--loss", "sapo", "--actor.sapo.tau_pos", "2", "--actor.sapo.tau_neg", "3")
    assert module.options == {"tau_pos": 2.0, "tau_neg": 3.0}
    _, module = build("--loss", "clip_cov", "--actor.clip_cov.clip_cov_ratio", "0.01", "--actor.dual_clip", "3",
                      "--actor.eps_clip_low_high", "0.2", "0.28")  # fmt: skip
    assert module.options["clip_cov_ratio"] == 0.01 and module.dual_clip == 3.0
    assert (module.clip_eps_low, module.clip_eps_high) == (0.2, 0.28)


def test_cispo_with_the_band_builds_band_policy_loss_with_every_band_option():
    args, module = build("--loss", "cispo", "--actor.cispo.bounds", "band", "--band_divergence", "tv", "--band_delta",
                         "0.1", "--actor.band.lower_floor", "0.8", "--actor.band.adaptive", "entropy")  # fmt: skip
    assert type(module) is BandPolicyLoss and module.policy_loss_type == "cispo"
    assert (module.band.divergence, module.band.delta, module.band.lower_floor) == ("tv", 0.1, 0.8)
    assert module.needs_entropy  # the adaptive radius applies to the band's bounds in CISPO too
    assert resolved_loss_config(args)["band"]["lower_floor"] == 0.8
    _, dcpo = build("--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.band.rule", "dcpo",
                    "--actor.eps_clip_low_high", "0.16", "0.2")  # fmt: skip
    assert dcpo.band.rule == "dcpo" and dcpo.band.dcpo_eps == (0.16, 0.2)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--loss", "sapo", "--actor.sapo.tau_pos", "0"], "tau_pos must be a finite number > 0"),
        (["--loss", "sapo", "--actor.sapo.tau_neg", "nan"], "tau_neg must be a finite number > 0"),
        (["--loss", "clip_cov", "--actor.clip_cov.clip_cov_ratio", "1.5"], "clip_cov_ratio must be a share"),
        (["--loss", "clip_cov", "--actor.clip_cov.clip_cov_lb", "6"], "clip_cov_lb must be < clip_cov_ub"),
        (["--loss", "kl_cov", "--actor.kl_cov.kl_cov_ratio", "0"], "kl_cov_ratio must be a share"),
        (["--loss", "kl_cov", "--actor.kl_cov.ppo_kl_coef", "-1"], "ppo_kl_coef must be a finite number >= 0"),
        (["--loss", "cispo", "--actor.cispo.bounds", "wide"], "expected one of fixed, band, got 'wide'"),
        # an option of an objective that is not selected is refused, not ignored
        (["--loss", "sapo", "--actor.clip_cov.clip_cov_ratio", "0.1"], "needs --loss clip_cov"),
        (["--actor.sapo.tau_pos", "2"], "needs --loss sapo"),
        # OpenRLHF's options where they mean nothing
        (["--loss", "cispo", "--actor.dual_clip", "3"], "--actor.dual_clip does not apply to --loss cispo"),
        (["--loss", "sapo", "--actor.dual_clip", "3"], "--actor.dual_clip does not apply to --loss sapo"),
        (["--loss", "gmpo", "--actor.dual_clip", "3"], "--actor.dual_clip does not apply to --loss gmpo"),
        (["--loss", "kl_cov", "--actor.dual_clip", "3"], "--actor.dual_clip does not apply to --loss kl_cov"),
        (["--loss", "clip_cov", "--actor.dual_clip", "0.5"], "dual_clip must be > 1"),
        (["--loss", "sapo", "--actor.eps_clip_low_high", "0.2", "0.2"], "does not apply to --loss sapo"),
        (["--loss", "kl_cov", "--actor.eps_clip_low_high", "0.2", "0.2"], "does not apply to --loss kl_cov"),
        # the band's flags: only with the band's bounds, and not DPPO's rule, not dual-clip, not fixed eps
        (["--loss", "cispo", "--band_delta", "0.1"], "--actor.cispo.bounds band"),
        (["--loss", "sapo", "--band_delta", "0.1"], "needs the band loss"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.band.rule", "dppo"], "DPPO is an objective"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.dual_clip", "3"], "does not apply"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.eps_clip_low_high", "0.2", "0.2"],
         "the band's bounds replace"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--band_delta", "-1"], "delta must be a positive"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.band.backend", "triton"], "runs in torch"),
        (["--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.eps_clip", "0.3"], "--actor.eps_clip does not"),
        # clip values and the single eps where they mean nothing or are not numbers >= 0
        (["--loss", "gmpo", "--actor.eps_clip_low_high", "-0.1", "0.2"], "takes clip values >= 0"),
        (["--loss", "clip_cov", "--actor.eps_clip", "nan"], "takes clip values >= 0"),
        (["--loss", "sapo", "--actor.eps_clip", "0.3"], "--actor.eps_clip does not apply to --loss sapo"),
        (["--loss", "kl_cov", "--actor.eps_clip", "0.3"], "--actor.eps_clip does not apply to --loss kl_cov"),
        # GMPO's IS weights go into a per-sequence geometric mean: no zero weights (token-level mask mode)
        (["--loss", "gmpo", "--algo.advantage.is_correction_level", "token"], "is_correction_mode clip"),
    ],
)  # fmt: skip
def test_bad_or_orphaned_values_fail_at_parse_time_with_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, *extra])
    assert exit_.value.code == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train_ppo_ray: error:")]
    assert len(error) == 1 and message in error[0], error


def test_make_policy_loss_builds_what_the_actor_builds():
    from openrlhf.models.loss import PolicyLoss

    assert type(make_policy_loss("ppo")) is PolicyLoss and make_policy_loss("gspo").policy_loss_type == "gspo"
    assert type(make_policy_loss("band", divergence="chi2")) is BandPolicyLoss
    band_cispo = make_policy_loss("cispo", bounds="band", delta=0.1)
    assert type(band_cispo) is BandPolicyLoss and band_cispo.policy_loss_type == "cispo"
    for name in OBJECTIVES:
        _, built = build("--loss", name)
        made = make_policy_loss(name)
        assert type(made) is type(built) and made.options == built.options
    with pytest.raises(ValueError, match="unknown policy loss 'cispo2'"):
        make_policy_loss("cispo2")
    with pytest.raises(ValueError, match="sapo has no option 'tau'"):
        make_policy_loss("sapo", tau=1.0)
    with pytest.raises(ValueError, match="dual_clip does not apply to kl_cov"):
        make_policy_loss("kl_cov", dual_clip=3.0)


def test_a_sequence_level_objective_ignores_the_token_flag_as_openrlhfs_gspo():
    assert make_policy_loss("gmpo", token_level_loss=True).token_level_loss is False
    assert make_policy_loss("sapo", token_level_loss=True).token_level_loss is True


def test_the_actor_logs_each_losss_own_metrics():
    torch.manual_seed(0)
    log_probs = torch.randn(4, 6).clamp(max=-0.05)
    old = log_probs + 0.2 * torch.randn(4, 6)
    adv, mask = torch.randn(4, 1), torch.ones(4, 6)
    for name, prefix in (("sapo", "sapo/"), ("band", "band/"), ("cispo", "cispo/")):
        module = make_policy_loss(name)
        module(log_probs, old, adv, mask)
        metrics = loss_metrics(module)
        assert metrics and all(key.startswith(prefix) for key in metrics), metrics
        assert all(v.dim() == 0 and math.isfinite(v.item()) for v in metrics.values())
    stock = make_policy_loss("ppo")
    stock(log_probs, old, adv, mask)
    assert loss_metrics(stock) == {}


def test_a_new_objective_is_one_registered_function():
    """The registry is the one room: a function and its options give the flags-free Python handle."""

    @register_objective(
        "test_vanilla_pg", options=(), verl_name="(none)", source="a test", sequence_level=False, uses_clip_eps=False,
        takes_dual_clip=False, clip_ratio_means="nothing",
    )  # fmt: skip
    def vanilla(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip):
        return ObjectiveLoss(-advantages * log_probs, torch.zeros_like(mask), {})

    try:
        log_probs = torch.randn(3, 5, requires_grad=True)
        loss = make_policy_loss("test_vanilla_pg")(log_probs, log_probs.detach(), torch.ones(3, 1))[0]
        loss.backward()
        assert torch.allclose(log_probs.grad, torch.full((3, 5), -1 / 15))  # token mean of -A log pi
    finally:
        OBJECTIVES.pop("test_vanilla_pg")


def test_gmpo_takes_the_is_correction_in_clip_mode_or_per_sequence():
    for flags in (["--algo.advantage.is_correction_mode", "clip"], ["--algo.advantage.is_correction_level", "seq"]):
        level = [] if "seq" in flags else ["--algo.advantage.is_correction_level", "token"]
        _, module = build("--loss", "gmpo", *level, *flags)
        assert module.is_correction.on
    with pytest.raises(ValueError, match="sequence-level objective"):
        make_policy_loss("gmpo", is_correction_level="token", is_correction_mode="mask")


def test_clip_cov_with_nothing_eligible_is_openrlhfs_dual_clipped_ppo():
    """Clip-Cov takes OpenRLHF's dual clip (verl's has none): with no token eligible it is PolicyLoss."""
    from openrlhf.models.loss import PolicyLoss

    torch.manual_seed(1)
    old = torch.randn(8, 16).clamp(max=-0.05)
    new = (old + torch.randn(8, 16)).requires_grad_()
    adv, mask = torch.randn(8, 1) * 2, (torch.rand(8, 16) > 0.2).float()
    ours = make_policy_loss("clip_cov", clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, clip_cov_lb=1e8,
                            clip_cov_ub=1e9)  # fmt: skip
    stock = PolicyLoss(0.2, 0.28, dual_clip=3.0)
    (a, *_), (b, *_) = ours(new, old, adv, mask), stock(new, old, adv, mask)
    (ga,), (gb,) = torch.autograd.grad(a, new), torch.autograd.grad(b, new)
    # the same float32 operations on the same operands in the same order, elementwise (max, min, clamp,
    # where, products), then OpenRLHF's own aggregate_loss: equal on every CPU
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert ours.loss_metrics["clip_cov/selected_frac"] == 0.0
    ratio = (new - old).exp().detach()
    clip1 = torch.min(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    assert ((adv < 0) & (3.0 * adv > clip1)).any()  # the dual clip acts in this batch


def test_a_dual_clipped_token_is_never_selected():
    torch.manual_seed(2)
    old = torch.randn(4, 32).clamp(max=-0.05)
    new = (old + torch.randn(4, 32)).requires_grad_()
    adv, mask = -torch.rand(4, 1) - 0.5, torch.ones(4, 32)
    loss_fn = make_policy_loss("clip_cov", dual_clip=1.5, clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9)
    loss_fn(new, old, adv, mask)
    ratio = (new - old).exp().detach()
    held = -1.5 * adv < torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))  # A < 0: held at -1.5 A
    assert held.any() and not held.all()
    eligible = loss_fn.loss_metrics["clip_cov/eligible_frac"]
    assert float(eligible) <= 1 - float(held.float().mean()) + 1e-6


def test_kl_cov_selects_through_a_non_contiguous_mask():
    torch.manual_seed(3)
    old = torch.randn(16, 8).clamp(max=-0.05)
    new, adv = old + 0.3 * torch.randn(16, 8), torch.randn(16, 8)
    mask = torch.ones(8, 16).t()  # dense but transposed: not contiguous
    assert not mask.is_contiguous()
    loss_fn = make_policy_loss("kl_cov", kl_cov_ratio=0.1)
    loss_fn(new, old, adv, mask)
    assert loss_fn.loss_metrics["kl_cov/selected_frac"] == pytest.approx(int(128 * 0.1) / 128)
