"""Device audit (issue 18, Devices): no code path of the trainable workers creates tensors on the CPU
by default, hard-codes CPU autocast, or leaves a fetched batch on the host.

There is no GPU here, so the audit runs the workers with ``worker.dp_rank.device`` set to ``meta``, a device
that is not the CPU, under a torch function mode that (a) records every tensor factory call made
from rlplane code whose ``device`` is missing or is not the worker's, and (b) maps ``meta`` back to
the CPU so the step still computes real numbers. A factory call that forgets ``device=`` (what
would put a CUDA worker's mask on the CPU and crash the step) fails the test with its file:line.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import rlplane
from rlplane.config.loading import ConfigError, load_config
from rlplane.dataplane import make_data_plane
from rlplane.models import precision
from rlplane.recipes.ppo import TRAIN_COLUMNS as PPO_FIELDS
from rlplane.runtime.devices import dist_backend, num_gpus_per_worker, resolve_device, to_device
from rlplane.training.plan import policy_options, value_options
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from rlplane.workers.value import ValueWorker
from tests.tiny import worker_cfg

SRC = os.path.dirname(rlplane.__file__)
# Host-side by design: the data plane stores and pads host tensors; devices.py does the copy over.
HOST_SIDE = (os.path.join(SRC, "dataplane"), os.path.join(SRC, "runtime", "devices.py"))
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.linspace, torch.eye}
META = torch.device("meta")
N = 8


def _to_cpu(x):
    if (isinstance(x, torch.device) and x.type == "meta") or (isinstance(x, str) and x.startswith("meta")):
        return torch.device("cpu")
    return x


class DeviceAudit(TorchFunctionMode):
    """Records rlplane factory calls with no device or a literal one; runs ``meta`` on the CPU."""

    def __init__(self):
        super().__init__()
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        follows_input = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
        if func in FACTORIES and not follows_input:
            device = kwargs.get("device")
            # A device taken from a tensor (``x.device``) is a torch.device and follows the data; a
            # missing one defaults to the CPU, and a string literal ("cpu") hard-codes it.
            if device is None or (isinstance(device, str) and not device.startswith("meta")):
                # The line that called the factory (torch's own internals, e.g. AdamW keeping its step
                # counters on the host, are torch's business: only rlplane lines are audited).
                frame = sys._getframe(1)
                where = frame.f_code.co_filename
                if where.startswith(SRC) and not where.startswith(HOST_SIDE):
                    self.violations.append(f"{os.path.relpath(where, SRC)}:{frame.f_lineno} "
                                           f"torch.{func.__name__}(device={device})")
        args = tuple(_to_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        return func(*args, **kwargs)


_cfg = functools.partial(worker_cfg, 2, 4, "loss_fn.reference_policy_kl_penalty=0.01", micro=4, logprob=4)  # N


def _put(client, fields, extra: dict):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(6, 12, (N,), generator=g).tolist()
    ids = [torch.randint(4, 21, (n,), generator=g) for n in lengths]
    client.register_partition("train", fields, N)
    cols = {"input_ids": ids, "token_mask": [torch.tensor([0] * 3 + [1] * (n - 3), dtype=torch.int8) for n in lengths],
            **{k: [torch.randn(n, generator=g) * s for n in lengths] for k, s in extra.items()}}
    return client.put_samples([f"s{i}_g0" for i in range(N)], "train", cols)


def test_policy_worker_creates_every_tensor_on_its_device():
    cfg = _cfg()
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _put(worker.dp_rank.dp, ["input_ids", "token_mask", "generation_logprobs", "advantages", "prev_logprobs",
                            "reference_policy_logprobs"], {"generation_logprobs": 0.1, "advantages": 1.0})
    worker.dp_rank.device = META
    with DeviceAudit() as audit:
        worker.compute_logprobs(meta, out_field="prev_logprobs")
        worker.compute_logprobs(meta, out_field="reference_policy_logprobs", reference=True)
        metrics = worker.train(meta, _loss(cfg))
    assert audit.violations == []
    assert metrics["grad_norm"] > 0  # the step really ran


def test_value_worker_creates_every_tensor_on_its_device():
    cfg = load_config("ppo_arithmetic", ["warmup.enabled=false", f"policy.train_global_batch_size={N}",
                                         "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4",
                                         "ppo.num_prompts_per_step=2", "ppo.num_generations_per_prompt=4"])
    worker = ValueWorker(value_options(cfg), make_data_plane("memory"))
    meta = _put(worker.dp_rank.dp, PPO_FIELDS, {"returns": 1.0})
    worker.dp_rank.device = META
    with DeviceAudit() as audit:
        worker.compute_values(meta)
        metrics = worker.train(meta)
    assert audit.violations == []
    assert metrics["grad_norm"] > 0


def test_audit_catches_a_factory_without_device():
    """The audit is not vacuous: a worker-side ``torch.arange(T)`` without ``device=`` is reported."""
    import rlplane.workers.policy as policy_module

    cfg = _cfg()
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _put(worker.dp_rank.dp, ["input_ids", "token_mask", "generation_logprobs", "advantages", "prev_logprobs",
                            "reference_policy_logprobs"], {"generation_logprobs": 0.1, "advantages": 1.0})
    worker.dp_rank.device = META
    code = compile("def leak(n):\n    return torch.arange(n)\n", policy_module.__file__, "exec")
    scope = {"torch": torch}
    exec(code, scope)  # a function whose frame says it lives in rlplane/workers/policy.py
    with DeviceAudit() as audit:
        scope["leak"](3)
        worker.compute_logprobs(meta, out_field="prev_logprobs")
    assert audit.violations and audit.violations[0].startswith(os.path.join("workers", "policy.py"))


def test_fetched_batches_land_on_the_worker_device():
    worker = PolicyWorker(policy_options(_cfg()), make_data_plane("memory"))
    meta = _put(worker.dp_rank.dp, ["input_ids", "token_mask"], {})
    worker.dp_rank.device = META  # real meta tensors: no compute, only placement
    data = worker.dp_rank.fetch(meta, ["input_ids", "token_mask"])
    assert {t.device for t in data.values()} == {META}


def test_autocast_follows_the_model_device(monkeypatch):
    """bf16 autocast is entered for the device type of the model's parameters (a CUDA model under
    CPU autocast would silently run fp32 while vLLM runs bf16)."""
    seen = []
    monkeypatch.setattr(precision.torch, "autocast", lambda device_type, dtype: seen.append((device_type, dtype)))
    model = torch.nn.Linear(2, 2, device="meta")
    precision.set_precision(model, "bf16")
    precision.autocast(model)
    precision.autocast(torch.nn.Linear(2, 2).requires_grad_(False).__class__(2, 2))
    assert seen == [("meta", torch.bfloat16)]  # the fp32 plain Linear (no precision set) enters nothing


def test_resolve_device_and_backend():
    assert resolve_device("cpu") == torch.device("cpu")
    # auto names the GPU by index where one is visible (cuda:0), the host otherwise.
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert auto.index == (torch.cuda.current_device() if torch.cuda.is_available() else None)
    assert dist_backend(torch.device("cpu")) == "gloo" and dist_backend(torch.device("cuda", 0)) == "nccl"
    assert num_gpus_per_worker("cuda", 0) == 1 and num_gpus_per_worker("auto", 0) == 0
    assert num_gpus_per_worker("auto", 4) == 1 and num_gpus_per_worker("cpu", 4) == 0
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"policy.device = cuda but this process sees no GPU.*set policy.device"):
            resolve_device("cuda")
    batch = to_device({"x": torch.ones(2)}, torch.device("cpu"))
    assert batch["x"].device.type == "cpu"


def _loss(cfg):
    """The recipe's clipped PG loss for ``cfg`` (what ``PolicyWorker.train`` takes)."""
    return ClippedPGLoss(cfg.loss_fn.options(), reference=cfg.loss_fn.reference_policy_kl_penalty != 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_hf_generation_on_the_gpu_is_seeded_and_takes_a_host_generator():
    from rlplane.generation import HFGenerationBackend
    from rlplane.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=0).cuda()
    backend = HFGenerationBackend(model, tok)
    prompts = [tok("1+2=")["input_ids"], tok("3+4=")["input_ids"]] * 2

    def draw(**kw):
        return backend.generate(prompts, max_new_tokens=6, temperature=1.0, stop_token_ids=[], **kw).output_ids

    assert draw(seed=3) == draw(seed=3)
    # A generator the caller made on the host drives the GPU sampler (its uniforms are moved over).
    host = draw(generator=torch.Generator().manual_seed(3))
    assert host == draw(generator=torch.Generator().manual_seed(3)) and len(host) == 4
