"""policy.precision: auto resolves by model size and the device's bf16 features (never a timing); bf16
generation and training logprobs agree (token_mult_prob_error near 1)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlplane.config.loading import load_config
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer, build_tiny_llama, precision as prec
from rlplane.workers.logprobs import token_logprobs


def _model(hidden: int):
    tok = build_char_tokenizer()
    return build_tiny_llama(tok, hidden_size=hidden, num_layers=2, num_heads=4, intermediate_size=2 * hidden,
                            seed=0), tok


def test_auto_is_the_default_and_explicit_choices_pass_through():
    assert load_config(None, []).policy.precision == "auto"
    model, _ = _model(64)
    assert prec.resolve_precision("bf16", model) == ("bf16", "set in the config")
    assert prec.resolve_precision("fp32", model)[0] == "fp32"
    with pytest.raises(ValueError, match="precision = 'fp16'"):
        prec.resolve_precision("fp16", model)


AMX_CPU = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})  # Intel Sapphire Rapids
AVX2_CPU = frozenset({"avx2", "fma", "f16c"})  # AMD EPYC Rome/Milan: bf16 emulated


def test_auto_keeps_tiny_models_fp32_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(prec, "cpu_flags", lambda: AMX_CPU)
    model, _ = _model(128)  # the default job's width
    chosen, why = prec.resolve_precision("auto", model)
    assert chosen == "fp32" and "hidden_size 128" in why


@pytest.mark.parametrize("flags, expected, named", [
    (AMX_CPU, "bf16", "avx512_bf16, amx_bf16"),
    (frozenset({"avx2", "avx512f", "avx512_bf16"}), "bf16", "avx512_bf16"),  # AMD EPYC Genoa (Zen 4)
    (frozenset({"fp", "asimd", "bf16", "i8mm"}), "bf16", "bf16"),  # Arm Neoverse V1 (aarch64 Features)
    (AVX2_CPU, "fp32", "none of"),
    (frozenset({"avx512f", "avx512bw"}), "fp32", "none of"),  # Skylake-SP: AVX-512 without bf16
    (frozenset(), "fp32", "none of"),  # flags unknown (no /proc/cpuinfo): fp32, the safe side
])
def test_auto_follows_the_cpus_bf16_flags(monkeypatch, flags, expected, named):
    monkeypatch.setattr(prec, "cpu_flags", lambda: flags)
    model, _ = _model(256)
    chosen, why = prec.resolve_precision("auto", model)
    assert chosen == expected and named in why


def test_auto_never_times_anything(monkeypatch):
    # The choice must not depend on how busy the machine is: no clock is read while deciding.
    import time

    monkeypatch.setattr(prec, "cpu_flags", lambda: AMX_CPU)
    monkeypatch.setattr(time, "perf_counter", lambda: pytest.fail("auto read a clock"))
    monkeypatch.setattr(time, "time", lambda: pytest.fail("auto read a clock"))
    model, _ = _model(256)
    assert prec.resolve_precision("auto", model)[0] == "bf16"


def test_cpu_flags_are_read_from_cpuinfo_text():
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\nprocessor\t: 1\n"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n"
    assert prec._linux_cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert prec._linux_cpu_flags(arm) == {"fp", "asimd", "bf16", "i8mm"}
    assert prec._linux_cpu_flags("") == set()
    assert prec.cpu_bf16_instructions(prec._linux_cpu_flags(x86)) == ["avx512_bf16", "amx_bf16"]


def test_this_machines_choice_is_the_same_every_time():
    prec.cpu_flags.cache_clear()
    model, _ = _model(256)
    first = prec.resolve_precision("auto", model)
    prec.cpu_flags.cache_clear()
    assert prec.resolve_precision("auto", model) == first


@pytest.mark.parametrize("bf16, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_for_a_gpu_asks_the_gpu_not_the_host(monkeypatch, bf16, expected):
    # A model is loaded on the host and moved to its GPU later: the GPU's bf16 support decides, whatever
    # the host's CPU flags (they must not even be read).
    monkeypatch.setattr(prec, "cpu_flags", lambda: pytest.fail("read the host's flags for a GPU model"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU-X")
    model, _ = _model(256)
    chosen, why = prec.resolve_precision("auto", model, torch.device("cuda", 0))
    assert chosen == expected and why.startswith("GPU-X ")


@pytest.mark.parametrize("device", ["cpu", "auto", "cuda"])
@pytest.mark.parametrize("gpu_visible", [False, True])
def test_configured_policy_decides_precision_for_its_device(monkeypatch, device, gpu_visible):
    # A process that sees a GPU decides for it under auto/cuda; one that sees none (a Ray driver loading
    # the model for itself) decides for its host rather than failing.
    from rlplane.models import configured

    seen = []
    monkeypatch.setattr(configured, "apply_precision", lambda model, precision, device: seen.append(device))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_visible)
    cfg = load_config(None, [f"policy.device={device}"])
    configured.load_configured_policy(cfg.policy, 0)
    assert seen == [torch.device("cuda" if gpu_visible and device != "cpu" else "cpu")]


def test_apply_precision_records_and_announces_once(monkeypatch, capsys):
    monkeypatch.setattr(prec, "cpu_flags", lambda: AMX_CPU)
    monkeypatch.setattr(prec, "_announced", set())
    for _ in range(2):
        model, _ = _model(256)
        assert prec.apply_precision(model, "auto") == "bf16"
        assert model.rlplane_autocast_dtype == torch.bfloat16
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["policy.precision: auto -> bf16 (this CPU has native bf16 (avx512_bf16, amx_bf16))"]


def test_bf16_generation_logprobs_match_bf16_training_logprobs():
    """token_mult_prob_error = mean over tokens of exp(|generation lp - training lp|): with both
    forwards under bf16 autocast it stays near 1 (the KV-cached decode and the full-sequence
    forward round differently, nothing more)."""
    model, tok = _model(256)
    prec.set_precision(model, "bf16")
    prompts = [tok("12+34=")["input_ids"], tok("7+5=")["input_ids"]] * 4
    out = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=8, stop_token_ids=[], seed=0)
    errors = []
    for p, ids, lp in zip(prompts, out.output_ids, out.logprobs):
        full = torch.tensor([p + ids])
        train_lp = token_logprobs(model, full, torch.ones_like(full), 1.0)[0, len(p):]
        errors.append(torch.exp((train_lp - lp).abs()))
    err = torch.cat(errors).mean().item()
    assert 1.0 <= err < 1.02, err


def test_bf16_keeps_the_lm_head_fp32_without_renaming_anything():
    model, tok = _model(64)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    prec.set_precision(model, "bf16")
    assert type(model.lm_head) is prec.FP32OutputLinear and list(model.state_dict()) == keys
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied
    ids = torch.tensor([tok("12+34=46")["input_ids"]])
    with prec.autocast(model):
        assert model(ids).logits.dtype == torch.float32
    prec.set_precision(model, "fp32")
    assert type(model.lm_head) is torch.nn.Linear


class _WeightCasts(TorchDispatchMode):
    """Counts autocast's bf16 copies of parameters (``aten._to_copy`` of an ``nn.Parameter``)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.nn.Parameter):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _bf16_trainer_step(keep: bool, monkeypatch, checkpointing: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """One optimizer step of a bf16 tiny Llama over 3 micro-batches (``checkpointing``: activations recomputed in
    the backward, as ``policy.activation_checkpointing``); its weights after it and the weight casts."""
    from rlplane.workers import trainer as trainer_module
    from rlplane.workers.packing import MicroBatch
    from rlplane.workers.rank import DPRank
    from rlplane.workers.trainer import Trainer

    if not keep:  # the trainer as it would be without the kept casts
        monkeypatch.setattr(trainer_module, "weight_casts_kept", lambda model, enabled=True: contextlib.nullcontext())
    model, _ = _model(256)
    prec.set_precision(model, "bf16")
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    cfg = load_config(None, [])
    trainer = Trainer(model, cfg.policy.optimizer, cfg.policy.scheduler,
                      DPRank("test", cfg.policy, None, rank=0, world_size=1, shared_paths=None))
    ids = torch.randint(4, 21, (6, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(6, 9)

    def forward(mb):
        with prec.autocast(model):
            return token_logprobs(model, ids[mb.rows], torch.ones_like(ids[mb.rows]), 1.0)[:, 1:]

    def loss(lp, batch, sample_mask, global_toks, _seqs):
        return -(lp * batch["mask"]).sum() / global_toks, {}

    casts = _WeightCasts()
    with casts:
        trainer.train_global_batches(mask, torch.ones(6), 6, lambda rows: [MicroBatch(r) for r in rows.split(2)],
                                     1.0, forward, loss, {"mask": mask})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, casts.count


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_training_step_casts_each_weight_once_and_changes_no_number(monkeypatch, checkpointing):
    """Autocast's bf16 copies of the weights are made at the first micro-batch and reused by the other two (and by
    the backward's recomputation under activation checkpointing): the same weights after the step bit for bit."""
    kept, kept_casts = _bf16_trainer_step(True, monkeypatch, checkpointing)
    fresh, fresh_casts = _bf16_trainer_step(False, monkeypatch, checkpointing)
    # 2 layers x 7 linear weights (q, k, v, o, gate, up, down), cast once per micro-batch without the kept casts
    # (and once more per micro-batch when the backward recomputes the layers).
    assert (kept_casts, fresh_casts) == (14, 3 * 14 * (2 if checkpointing else 1))
    for k in kept:
        assert torch.equal(kept[k], fresh[k]), k
    assert not torch.is_autocast_enabled("cpu")  # the region is closed, the cache cleared


def test_kept_casts_are_a_no_op_for_fp32_and_when_disabled():
    model, _ = _model(64)
    prec.set_precision(model, "fp32")
    with prec.weight_casts_kept(model):
        assert torch.autocast_increment_nesting() == 1  # nothing held open
        torch.autocast_decrement_nesting()
    prec.set_precision(model, "bf16")
    with prec.weight_casts_kept(model, enabled=False):
        assert torch.autocast_increment_nesting() == 1
        torch.autocast_decrement_nesting()
    with prec.weight_casts_kept(model):
        assert torch.autocast_increment_nesting() == 2  # one held open
        torch.autocast_decrement_nesting()


def test_kept_casts_are_a_no_op_under_fsdp(tmp_path):
    """FSDP gathers the parameters afresh for each forward: nothing is held open for a sharded model."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    model, _ = _model(256)
    prec.set_precision(model, "bf16")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        fully_shard(model)
        with prec.weight_casts_kept(model):
            assert torch.autocast_increment_nesting() == 1
            torch.autocast_decrement_nesting()
    finally:
        dist.destroy_process_group()
