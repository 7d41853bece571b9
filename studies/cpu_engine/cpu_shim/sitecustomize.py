"""Test-only CPU shim: lets OpenRLHF 0.11.2's real `train_ppo_ray` run on a machine without CUDA.

Loaded by Python at start-up (`sitecustomize`) in every process of an end-to-end run, because
`studies/cpu_engine/train.sh` puts this folder on PYTHONPATH before it starts Ray: the driver, the Ray actors
(DeepSpeed actor and reference, the vLLM rollout actor) and vLLM's engine-core process. It patches
OpenRLHF modules in memory right after they are imported; no file on disk changes, and nothing of it
is in `openrlhf_band`. Each patch is one entry of PATCHES with the reason it exists; each is shown to
be needed by tests/e2e/test_cpu_shim.py (the unpatched call fails on this machine), except the probes
below and `avx2_cpu_when_emulating`, inert unless the suite is measured as a CPU without native bf16
(its docstring says why it is needed there).

Also here, and named as what it is, a probe (not a patch): after every DeepSpeed -> vLLM weight sync
it appends digests of the trainer's and the engine's weights to $E2E_SYNC_LOG, and with
E2E_SYNC_NEGATIVE_CONTROL=1 the engine receives the weights but does not load them, so the test that
reads the log can be shown to fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
from importlib.abc import MetaPathFinder


def _torch_with_cuda_on_cpu():
    """A torch for OpenRLHF's modules whose CUDA device is the CPU; everything else is the real torch.
    Registered in sys.modules under its own name in every shimmed process, so that the methods Ray
    pickles by value (its @ray.remote actor classes) find it again on the other side."""
    if _TORCH_ON_CPU in sys.modules:
        return sys.modules[_TORCH_ON_CPU]

    def real(name):
        import torch

        return getattr(torch, name)

    proxy = types.ModuleType(_TORCH_ON_CPU)
    proxy.__getattr__ = real  # module-level __getattr__ (PEP 562): all but the two names below
    proxy.cuda = types.SimpleNamespace(
        current_device=lambda: "cpu",  # callers pass it to .to() / device=
        set_device=lambda device: None,
        synchronize=lambda *args: None,
        current_stream=lambda *args: None,  # only handed to the (gloo) sync group, which ignores it
        empty_cache=lambda: None,
        is_available=lambda: False,
    )
    proxy.device = lambda spec, *args: real("device")("cpu" if str(spec).startswith("cuda") else spec, *args)
    sys.modules[_TORCH_ON_CPU] = proxy
    return proxy


_TORCH_ON_CPU = "e2e_cpu_shim_torch"


def _cuda_on_cpu(module) -> None:
    """OpenRLHF calls torch.cuda.current_device / set_device / synchronize / current_stream and builds
    `torch.device("cuda:N")` on its training path; on a CPU torch these raise. The module's `torch` is
    replaced by one whose CUDA device is the CPU."""
    module.torch = _torch_with_cuda_on_cpu()


def _device_mesh_on_cpu(module) -> None:
    """`DeepspeedStrategy.setup_distributed` builds `init_device_mesh("cuda", ...)`, whose DeviceMesh
    calls torch.cuda.set_device (absent from a CPU torch): the same mesh over the CPU (gloo)."""
    from torch.distributed.device_mesh import init_device_mesh

    module.init_device_mesh = lambda device_type, *args, **kwargs: init_device_mesh("cpu", *args, **kwargs)


def _barrier_without_cuda_sync(module) -> None:
    """`torch_dist_barrier_and_cuda_sync` ends with torch.cuda.synchronize(), which raises on a CPU
    torch (it imports torch inside the function, so _cuda_on_cpu cannot reach it): keep the barrier."""
    import torch

    module.torch_dist_barrier_and_cuda_sync = lambda: torch.distributed.barrier()


class _GlooBroadcastGroup:
    """What OpenRLHF uses of vLLM's PyNcclCommunicator: `.broadcast(tensor, src, stream)`, over gloo."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        timeout = timedelta(seconds=float(os.environ.get("E2E_SYNC_TIMEOUT_S", "300")))
        store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("openrlhf-weight-sync", store), rank, world_size, timeout)

    def broadcast(self, tensor, src: int, stream=None) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = src
        self._group.broadcast([tensor], options).wait()


def _gloo_weight_sync_group(module) -> None:
    """`stateless_init_process_group` always builds vLLM's PyNcclCommunicator, whatever
    --vllm.sync_backend says. Without NCCL it disables itself and its broadcast returns without sending:
    vLLM would silently keep uninitialised memory. A gloo group with the same interface carries them."""
    module.stateless_init_process_group = (
        lambda master_address, master_port, rank, world_size, device: _GlooBroadcastGroup(
            master_address, master_port, rank, world_size
        )
    )


def _digests(named_tensors) -> dict[str, str]:
    """name -> sha256 of the tensor's bytes (bit-exact comparison across processes)."""
    import torch

    out = {}
    for name, tensor in named_tensors:
        if tensor.numel() == 0:  # vLLM's CPU backend keeps repacked linear weights elsewhere
            continue
        data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
        out[name] = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]
    return out


def _log_sync(record: dict) -> None:
    path = os.environ.get("E2E_SYNC_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _cpu_weight_reload(module) -> None:
    """`WorkerWrap.update_weight` receives into `device="cuda"` and loads each parameter through its
    `weight_loader`; vLLM's CPU backend repacks linear weights after loading (oneDNN) and drops that
    loader. Receive on the CPU, collect the sync, and reload it through vLLM's own
    `model_runner.reload_weights` when OpenRLHF marks the last parameter (`empty_cache=True`)."""
    import torch

    def update_weight(self, name, dtype, shape, empty_cache=False):
        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(shape, dtype=dtype, device="cpu")
        self._model_update_group.broadcast(weight, src=0)
        pending = self.__dict__.setdefault("_e2e_received", [])
        pending.append((name, weight))
        if not empty_cache:
            return
        self._e2e_received, self._e2e_syncs = [], getattr(self, "_e2e_syncs", 0) + 1
        loaded = os.environ.get("E2E_SYNC_NEGATIVE_CONTROL") != "1"
        if loaded:
            self.model_runner.reload_weights(weights_iterator=iter(pending), is_checkpoint_format=True)
        _log_sync({  # probe: what arrived, and what the engine holds after the (re)load
            "side": "engine", "sync": self._e2e_syncs, "loaded": loaded, "received": _digests(pending),
            "engine": _digests(self.model_runner.get_model().named_parameters()),
        })  # fmt: skip

    module.WorkerWrap.update_weight = update_weight


def _record_trainer_weights(module) -> None:
    """Probe, not a patch: after each `broadcast_to_vllm`, rank 0 logs digests of the weights it sent. Under
    ZeRO-3 the gather is a collective: every rank enters it (a rank-0-only gather hangs a run of 2 ranks)."""
    original = module.ActorPPOTrainer.broadcast_to_vllm

    def broadcast_to_vllm(self):
        original(self)
        import deepspeed
        import torch.distributed as dist

        if not os.environ.get("E2E_SYNC_LOG"):
            return
        self._e2e_syncs = getattr(self, "_e2e_syncs", 0) + 1
        params = list(self.actor.model.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=self.args.ds.zero_stage == 3):
            if dist.get_rank() == 0:
                _log_sync({"side": "trainer", "sync": self._e2e_syncs, "trainer": _digests(params)})

    module.ActorPPOTrainer.broadcast_to_vllm = broadcast_to_vllm


def _record_loss_calls(module) -> None:
    """Probe, not a patch: each call of the band loss appends the count of tokens its action mask lets in (what
    its bounds, clip fractions and entropy are computed over) and, when it receives an entropy, that entropy's
    sum over them to $E2E_LOSS_LOG (to compare the entropy of the same tokens before and after a step, and to
    count the tokens an agent's run trained on)."""
    original = module.BandPolicyLoss.forward

    def forward(self, log_probs, *args, entropy=None, **kwargs):
        result = original(self, log_probs, *args, entropy=entropy, **kwargs)
        path = os.environ.get("E2E_LOSS_LOG")
        if path:
            mask = kwargs.get("action_mask")
            keep = (mask != 0) if mask is not None else (log_probs == log_probs)
            record = {"tokens": int(keep.sum()), "entropy_sum": None if entropy is None else float(entropy[keep].sum())}
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        return result

    module.BandPolicyLoss.forward = forward


def _record_training_batches(module) -> None:
    """Probe, not a patch: each training batch appends to $E2E_BATCH_LOG, from the experience the actor trains on,
    its action tokens (the action mask), its environment tokens (after a sample's first action, attended, outside
    the mask: a multi-turn agent's feedback) with the token ids of each such span, and each sample's prompt
    (a digest) and score (what DAPO's filter reads)."""
    original = module.ActorPPOTrainer.training_step

    def training_step(self, experience, *args, **kwargs):
        path = os.environ.get("E2E_BATCH_LOG")
        if path:
            action = experience.action_mask.bool()
            tokens = experience.sequences[:, -action.shape[1] :]  # the token each action position predicts
            attended = experience.attention_mask[:, -action.shape[1] :].bool()
            environment = attended & ~action & (action.long().cumsum(dim=1) > 0)
            spans = []
            for row, ids in zip(environment.tolist(), tokens.tolist()):
                span = []
                for inside, token in zip([*row, False], [*ids, None]):
                    if inside:
                        span.append(token)
                    elif span:
                        spans.append(span)
                        span = []
            scores = experience.scores.tolist() if experience.scores is not None else [None] * len(action)
            record = {
                "action_tokens": int(action.sum()),
                "environment_tokens": int(environment.sum()),
                "environment_spans": spans,
                "samples": [[hashlib.sha1(p.encode()).hexdigest()[:12], score]
                            for p, score in zip(experience.prompts, scores)],  # fmt: skip
            }
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        return original(self, experience, *args, **kwargs)

    module.ActorPPOTrainer.training_step = training_step


def _record_forward_dispatches(module) -> None:
    """Probe, not a patch: each forward pass the experience maker dispatches (`RemoteExperienceMaker._dispatch_forward`:
    the actor's recompute of pi_old, which `--actor.band.anchor rollout` skips, the critic's, the reference's, the
    reward model's) appends the model group and its number of sequences to $E2E_FORWARD_LOG. (The experience maker
    runs in the driver, or in the asynchronous trainer's actor: a plain class in both, where Ray's remote actor
    classes cannot be patched from outside.)"""
    original = module.RemoteExperienceMaker._dispatch_forward

    def _dispatch_forward(self, group, sync_condition, **kwargs):
        path = os.environ.get("E2E_FORWARD_LOG")
        if path:
            names = {"actor": self.actor_model_group, "critic": self.critic_model_group,
                     "reference": self.initial_model_group, "reward": self.reward_model_group}  # fmt: skip
            name = next((n for n, g in names.items() if g is not None and g is group), "unknown")
            sequences = sum(int(s.shape[0]) for s in kwargs.get("sequences", []))
            with open(path, "a") as f:
                f.write(json.dumps({"group": name, "sequences": sequences}) + "\n")
        return original(self, group, sync_condition, **kwargs)

    module.RemoteExperienceMaker._dispatch_forward = _dispatch_forward


def _compare_fused_logprobs(module) -> None:
    """Probe, not a patch: with --ds.fused_logprobs, the first training batch of each actor process is
    also run through OpenRLHF's own forward (the fused head switched off), no gradient, and the largest
    difference of the action log-probs (and entropy) is appended to $E2E_FUSED_LOG."""
    original = module.ActorPPOTrainer.training_step

    def training_step(self, experience, *args, **kwargs):
        path = os.environ.get("E2E_FUSED_LOG")
        head = getattr(self.actor, "fused_head", None)
        if path and head is not None and not getattr(self, "_e2e_fused_compared", False):
            self._e2e_fused_compared = True
            import torch

            def run():
                log_probs, output = self.actor(
                    experience.sequences, experience.action_mask, attention_mask=experience.attention_mask,
                    return_output=True, return_entropy=True,
                )  # fmt: skip
                return log_probs, output.entropy[:, -experience.action_mask.shape[1] :]

            with torch.no_grad():
                fused_lp, fused_ent = run()
                self.actor.fused_head = None  # OpenRLHF's forward, same weights, same batch
                try:
                    plain_lp, plain_ent = run()
                finally:
                    self.actor.fused_head = head
            mask = experience.action_mask.bool()
            record = {
                "tokens": int(mask.sum()),
                "max_abs_log_prob_diff": float((fused_lp - plain_lp)[mask].abs().max()),
                "max_abs_entropy_diff": float((fused_ent - plain_ent)[mask].abs().max()),
                "log_prob_range": [float(plain_lp[mask].min()), float(plain_lp[mask].max())],
            }
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        return original(self, experience, *args, **kwargs)

    module.ActorPPOTrainer.training_step = training_step


def _record_clip_bins(module) -> None:
    """Probe, not a patch: each call of OpenRLHF's own clipped loss (`ppo`) appends, per old-probability
    bin of the band's metrics (openrlhf_band.integration.metrics), the count of tokens and of tokens
    whose clipped branch is active (A > 0 and r > 1 + eps_high, or A < 0 and r < 1 - eps_low: the band's
    definition) to $E2E_CLIP_BINS_LOG; the band's own losses log the same as band/tokens_*, band/clipped_*."""
    original = module.PolicyLoss.forward

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, *args, **kwargs):
        path = os.environ.get("E2E_CLIP_BINS_LOG")
        if path and self.policy_loss_type == "ppo":
            import torch

            from openrlhf_band.integration.metrics import _BIN_NAMES, METRIC_PROB_BINS

            with torch.no_grad():
                ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0).exp()
                mask = torch.ones_like(ratio, dtype=torch.bool) if action_mask is None else action_mask != 0
                adv = advantages.expand_as(ratio)
                clipped = ((adv > 0) & (ratio > 1 + self.clip_eps_high)) | ((adv < 0) & (ratio < 1 - self.clip_eps_low))
                p = old_log_probs.float().exp()
                record = {"eps": [self.clip_eps_low, self.clip_eps_high], "tokens": {}, "clipped": {}}
                for name, lo, hi in zip(_BIN_NAMES, METRIC_PROB_BINS[:-1], METRIC_PROB_BINS[1:]):
                    in_bin = mask & (p >= lo) & ((p < hi) if hi < 1.0 else (p <= hi))
                    record["tokens"][name] = int(in_bin.sum())
                    record["clipped"][name] = int((in_bin & clipped).sum())
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        return original(self, log_probs, old_log_probs, advantages, action_mask, *args, **kwargs)

    module.PolicyLoss.forward = forward


def _float32_on_cpu(module) -> None:
    """Only with E2E_PARAM_DTYPE=float32: the real-model runs, and every run that pins no dtype on a CPU
    without native bf16 (studies/cpu_engine/cpu_dtype.py, docs/e2e_cpu.md#dtype). OpenRLHF 0.11.2 trains and samples in
    bf16 or fp16 only: `--ds.param_dtype` accepts those two, and vLLM's dtype is fixed to bfloat16.
    A CPU without native bf16 (no AVX512_BF16 / AMX) emulates it: a forward + backward of SmolLM2-135M
    costs ~15x float32's there (217-226 s against 14-15 s, 8 x 128 tokens, measured while planning, not
    recorded here); on one with it bf16 is
    faster (0.51x, studies/smollm2/results/dtype_cost.json). The study runs on both kinds of machine, so
    its runs use the dtype that is usable, and the same, on every CPU: the model's weights
    (convert_to_torch_dtype), DeepSpeed's config (bf16 off: float32) and vLLM's engine all go to float32.
    The tiny model's runs take it only where the CPU would emulate bf16."""
    import torch

    if module.__name__ == "openrlhf.utils.utils":
        module.convert_to_torch_dtype = lambda param_dtype: torch.float32
    elif module.__name__ == "openrlhf.utils.deepspeed.deepspeed":
        def without_bf16(make_config):
            def make(*args, **kwargs):
                config = make_config(*args, **kwargs)
                config["bf16"]["enabled"] = config["fp16"]["enabled"] = False
                return config

            return make

        module.get_train_ds_config = without_bf16(module.get_train_ds_config)
        module.get_eval_ds_config = without_bf16(module.get_eval_ds_config)
    elif module.__name__ == "openrlhf.trainer.ray.vllm_engine":
        real_vllm = module.vllm

        class EngineArgsInFloat32(real_vllm.AsyncEngineArgs):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "dtype": "float32"})

        proxy = types.ModuleType("e2e_cpu_shim_vllm")
        proxy.__getattr__ = lambda name: getattr(real_vllm, name)
        proxy.AsyncEngineArgs = EngineArgsInFloat32
        module.vllm = proxy


def _avx2_cpu_when_emulating(module) -> None:
    """Measurement only, with E2E_EMULATE_NO_BF16=1 (`make ci-no-bf16`, docs/tests.md#timings): the suite's
    time on a CPU without native bf16 is measured on one with it, by capping oneDNN, ATen and MKL at AVX2.
    vLLM reads the CPU's features through torch.cpu's queries, which the caps do not change: it loads its
    AVX512-BF16 kernels (vllm._C), picks its AMX GEMM, which the capped oneDNN refuses ("BFloat16 Brgemm
    VNNI format is only supported ... when `amx` is supported": the engine aborts at its first bf16
    rollout), and its AMX attention (the engine's worker was killed by SIGILL, exit -4, at its first bf16
    rollout, with the GEMM alone kept off AMX). The queries answer as an AVX2 CPU's do, so that vLLM loads
    vllm._C_AVX2 and its AVX2 paths, as on such a CPU."""
    import torch

    for query in ("_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_avx512_bf16_supported",
                  "_is_avx512_supported", "_is_avx512_vnni_supported"):  # fmt: skip
        if hasattr(torch.cpu, query):
            setattr(torch.cpu, query, lambda: False)


# module -> [(patch name, function)]; the reasons are the functions' docstrings
PATCHES = {
    "openrlhf.trainer.ray.ppo_actor": [
        ("cuda_on_cpu", _cuda_on_cpu),
        ("sync_probe", _record_trainer_weights),
        ("fused_logprobs_probe", _compare_fused_logprobs),
        ("training_batches_probe", _record_training_batches),
    ],
    "openrlhf.trainer.ppo_utils.experience_maker": [("forward_dispatch_probe", _record_forward_dispatches)],
    "openrlhf.trainer.ray.launcher": [("cuda_on_cpu", _cuda_on_cpu)],
    "openrlhf.trainer.ray.ppo_critic": [("cuda_on_cpu", _cuda_on_cpu)],  # PPO with a critic (gae)
    "openrlhf.trainer.ppo_utils.replay_buffer": [("cuda_on_cpu", _cuda_on_cpu)],
    "openrlhf.utils.deepspeed.deepspeed": [
        ("cuda_on_cpu", _cuda_on_cpu),
        ("device_mesh_on_cpu", _device_mesh_on_cpu),
        ("float32_on_cpu", _float32_on_cpu),
    ],
    "openrlhf.utils.utils": [("float32_on_cpu", _float32_on_cpu)],
    "openrlhf.trainer.ray.vllm_engine": [("float32_on_cpu", _float32_on_cpu)],
    "openrlhf.utils.distributed_util": [
        ("barrier_without_cuda_sync", _barrier_without_cuda_sync),
        ("gloo_weight_sync", _gloo_weight_sync_group),
    ],
    "openrlhf.trainer.ray.vllm_worker_wrap": [("cpu_weight_reload", _cpu_weight_reload)],
    "openrlhf_band.integration.policy_loss": [("loss_calls_probe", _record_loss_calls)],
    "openrlhf.models.loss": [("clip_bins_probe", _record_clip_bins)],
    "vllm.platforms.cpu": [("avx2_cpu_when_emulating", _avx2_cpu_when_emulating)],
}
SKIPPED = set(filter(None, os.environ.get("E2E_SHIM_SKIP", "").split(",")))  # to show a patch is needed
if os.environ.get("E2E_PARAM_DTYPE", "bf16") != "float32":
    SKIPPED.add("float32_on_cpu")
if os.environ.get("E2E_EMULATE_NO_BF16") != "1":
    SKIPPED.add("avx2_cpu_when_emulating")


class _PatchAfterImport(MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is not self and (spec := finder.find_spec(fullname, path, target)) is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            for name, apply in PATCHES[fullname]:
                if name not in SKIPPED:
                    apply(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("E2E_CPU_SHIM") == "1":
    _torch_with_cuda_on_cpu()
    sys.meta_path.insert(0, _PatchAfterImport())
