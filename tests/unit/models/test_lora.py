"""policy.lora: only adapter parameters train; the generator gets merged weights under HF names;
checkpoints hold the adapter; the exported merged model reproduces the trained policy's logprobs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

import functools

from rlplane.cli import main as cli_main  # noqa: E402
from rlplane.config.loading import dump_config, load_config  # noqa: E402
from rlplane.dataplane import make_data_plane  # noqa: E402
from rlplane.generation import HFGenerationBackend  # noqa: E402
from rlplane.models import load_policy  # noqa: E402
from rlplane.models.lora import is_lora, policy_weights  # noqa: E402
from rlplane.recipes.grpo import TRAIN_COLUMNS as TRAIN_FIELDS  # noqa: E402
from rlplane.training.plan import policy_options
from rlplane.workers.logprobs import token_logprobs  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker  # noqa: E402
from tests.tiny import worker_cfg

N = 8
LORA = ["policy.lora.enabled=true", "policy.lora.rank=4", "policy.lora.alpha=8", "policy.precision=fp32"]


_cfg = functools.partial(worker_cfg, 2, 4, "policy.generation.max_new_tokens=6", "policy.optimizer.lr=0.05", *LORA,
                         micro=4, logprob=8)  # N samples


def _batch(worker, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(4, 21, (5,), generator=g).tolist() for _ in range(N)]
    out = HFGenerationBackend(worker.model, worker.tokenizer).generate(prompts, max_new_tokens=6, generator=g)
    ids = [torch.tensor(p + o) for p, o in zip(prompts, out.output_ids)]
    mask = [torch.tensor([0] * len(p) + [1] * len(o), dtype=torch.int8) for p, o in zip(prompts, out.output_ids)]
    gen_lp = [torch.cat([torch.zeros(len(p)), lp]) for p, lp in zip(prompts, out.logprobs)]
    adv = torch.randn(N, generator=g)
    worker.dp_rank.dp.register_partition("train", TRAIN_FIELDS, N)
    meta = worker.dp_rank.dp.put_samples(
        [f"s{i}_g0" for i in range(N)], "train",
        {"input_ids": ids, "token_mask": mask, "generation_logprobs": gen_lp,
         "advantages": [adv[i].expand(len(x)).clone() for i, x in enumerate(ids)]},
    )
    return meta, ids


def _trained_worker():
    cfg = _cfg()
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta, ids = _batch(worker)
    before = {k: v.detach().clone() for k, v in worker.model.named_parameters()}
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=worker.reference is not None))
    return cfg, worker, before, ids


def test_only_adapter_parameters_change_after_a_train_step():
    cfg, worker, before, _ = _trained_worker()
    assert is_lora(worker.model)
    changed = {k for k, v in worker.model.named_parameters() if not torch.equal(v, before[k])}
    adapters = {k for k in before if ".lora_" in k}
    # lora_A starts random and lora_B at 0: both get gradients once B moves, A from the first step on
    # (d loss / d A = B^T (...) = 0 while B = 0, so A is unchanged after one step; B must change).
    assert changed and changed <= adapters, sorted(changed - adapters)[:5]
    assert any(".lora_B." in k for k in changed)
    frozen = [k for k, v in worker.model.named_parameters() if not v.requires_grad]
    assert frozen and all(".lora_" not in k for k in frozen)
    # The optimizer holds the adapters only.
    assert sum(len(g["params"]) for g in worker.trainer.optimizer.param_groups) == len(adapters)


def test_generator_refit_gets_merged_weights_under_hf_names():
    cfg, worker, _, ids = _trained_worker()
    merged = worker.get_weights()
    plain, _ = load_policy(cfg.policy.model_name, seed=cfg.loop.seed, model_kwargs=cfg.policy.tiny.model_dump())
    assert set(merged) == set(plain.state_dict())  # HF names: no base_model / base_layer / lora_ keys
    changed = [k for k, v in plain.state_dict().items() if not torch.equal(v, merged[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the adapters' deltas are merged in
    HFGenerationBackend(plain, worker.tokenizer).update_weights(merged)
    x = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
    attn = (x != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(plain, x, attn, 1.0),
                                   token_logprobs(worker.model.eval(), x, attn, 1.0),
                                   atol=1e-5, rtol=0)


def test_checkpoint_holds_the_adapter_and_export_reproduces_the_policy(tmp_path):
    cfg, worker, _, ids = _trained_worker()
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    (ckpt / "policy").mkdir(parents=True)
    worker.save(str(ckpt / "policy"))
    (ckpt / "config.yaml").write_text(dump_config(cfg))
    (ckpt / "training_info.json").write_text('{"step": 1, "metrics": {}}')
    saved = {p.name for p in (ckpt / "policy" / "weights").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= saved and "model.safetensors" not in saved

    # Resume path: a fresh LoRA worker loads the adapter and computes the same logprobs.
    fresh = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    fresh.load(str(ckpt / "policy"))
    x = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
    attn = (x != 0).long()
    with torch.no_grad():
        trained = token_logprobs(worker.model.eval(), x, attn, 1.0)
        torch.testing.assert_close(token_logprobs(fresh.model.eval(), x, attn, 1.0), trained, atol=1e-6, rtol=0)

    out = tmp_path / "merged"
    assert cli_main(["export", "--checkpoint", str(ckpt), "--output", str(out)]) == 0
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not is_lora(exported)
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(exported, x, attn, 1.0), trained, atol=1e-5, rtol=0)


def test_lora_config_errors_are_one_line():
    with pytest.raises(Exception) as e:
        load_config(None, ["policy.lora.enabled=true"])  # the default job warms up all weights
    assert "warmup.enabled=false" in str(e.value)
    cfg = _cfg("policy.lora.target_modules=[nope]")
    with pytest.raises(ValueError, match=r"target_modules: \['nope'\] name no linear layer"):
        PolicyWorker(policy_options(cfg), make_data_plane("memory"))


def test_policy_weights_of_a_plain_model_is_its_state_dict():
    model, _ = load_policy("embedded:tiny-llama")
    w = policy_weights(model)
    assert set(w) == set(model.state_dict()) and all(torch.equal(w[k], v) for k, v in model.state_dict().items())
