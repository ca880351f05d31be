"""Per-call micro-batch sizes and ``eval_mode`` on the policy worker's data-plane calls (NeMo RL's
``get_logprobs_from_meta(meta, micro_batch_size)``, ``train_from_meta(meta, loss_fn, eval_mode, gbs, mbs)``):
another cut gives the same numbers, and ``eval_mode`` leaves the weights and optimizer untouched."""

from __future__ import annotations

import copy

import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.recipes.grpo import TRAIN_COLUMNS
from rlplane.training.plan import policy_options
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker

N = 12


def _worker(*extra) -> PolicyWorker:
    # One model forward per micro-batch (the shared-prefix forward makes two).
    cfg = load_config(None, ["warmup.enabled=false", f"policy.train_global_batch_size={N}",
                             "policy.shared_prefix_forward=false", "policy.train_micro_batch_size=6",
                             "policy.logprob_batch_size=6",
                             "grpo.num_prompts_per_step=3", "grpo.num_generations_per_prompt=4",
                             "loss_fn.reference_policy_kl_penalty=0.05", *extra])
    return PolicyWorker(policy_options(cfg), make_data_plane("memory"))


def _batch(worker: PolicyWorker, seed: int = 0):
    """N sequences of varied lengths with random advantages and generation logprobs."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(6, 14, (N,), generator=g).tolist()
    ids = [torch.randint(4, 20, (n,), generator=g) for n in lens]
    mask = [torch.tensor([0] * 3 + [1] * (n - 3), dtype=torch.int8) for n in lens]
    gen_lp = [-torch.rand(n, generator=g) for n in lens]
    adv = [torch.randn(1, generator=g).expand(n).clone() for n in lens]
    worker.dp_rank.dp.register_partition("train", TRAIN_COLUMNS, N)
    return worker.dp_rank.dp.put_samples([f"s{i}_g0" for i in range(N)], "train",
                                         {"input_ids": ids, "token_mask": mask, "generation_logprobs": gen_lp,
                                          "advantages": adv})


def _forwards(model: torch.nn.Module) -> list[int]:
    """A list that grows by one per forward of ``model`` (one per micro-batch)."""
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def _read(worker, meta, field):
    return worker.dp_rank.dp.get_samples(meta, "train", [field])[field]


def test_per_call_logprob_micro_batch_size_changes_the_cut_not_the_logprobs():
    worker = _worker()
    meta = _batch(worker)
    for reference, field in ((False, "prev_logprobs"), (True, "reference_policy_logprobs")):
        model = worker.reference.model if reference else worker.model
        calls = _forwards(model)
        out = {}
        for size, forwards in ((None, 2), (1, N), (5, 3), (N, 1)):
            calls.clear()
            worker.compute_logprobs(meta, out_field=field, reference=reference, micro_batch_size=size)
            assert len(calls) == forwards, (field, size, len(calls))
            out[size] = _read(worker, meta, field)
        for size in (1, 5, N):
            torch.testing.assert_close(out[size], out[None], atol=2e-5, rtol=0)


def test_per_call_train_mbs_changes_the_cut_not_the_loss_or_the_step():
    a, b = _worker(), _worker()
    loss = ClippedPGLoss(load_config(None, []).loss_fn.options(), reference=False)
    results, weights = [], []
    for worker, mbs, forwards in ((a, None, 2), (b, 4, 3)):
        meta = _batch(worker)
        worker.compute_logprobs(meta)
        calls = _forwards(worker.model)
        results.append(worker.train(meta, loss, mbs=mbs))
        assert len(calls) == forwards
        weights.append({k: v.clone() for k, v in worker.model.state_dict().items()})
    assert abs(results[0]["loss"] - results[1]["loss"]) < 1e-6
    assert abs(results[0]["grad_norm"] - results[1]["grad_norm"]) < 1e-5
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], atol=1e-6, rtol=0)


def test_per_call_gbs_sets_the_number_of_optimizer_steps():
    worker = _worker()
    meta = _batch(worker)
    worker.compute_logprobs(meta)
    steps = []
    worker.trainer.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    worker.train(meta, ClippedPGLoss(load_config(None, []).loss_fn.options(), reference=False), gbs=N // 2)
    assert len(steps) == 2


def test_eval_mode_gives_the_loss_and_metrics_without_a_step():
    worker = _worker()
    meta = _batch(worker, seed=3)
    worker.compute_logprobs(meta)
    worker.compute_logprobs(meta, out_field="reference_policy_logprobs", reference=True)
    loss = ClippedPGLoss(load_config(None, ["loss_fn.reference_policy_kl_penalty=0.05"]).loss_fn.options(),
                         reference=True)
    before = copy.deepcopy(worker.model.state_dict())
    lr_before, epoch_before = worker.trainer.optimizer.param_groups[0]["lr"], worker.trainer.scheduler.last_epoch
    evaluated = worker.train(meta, loss, eval_mode=True)
    for k, v in worker.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert worker.trainer.optimizer.state == {} and worker.trainer.scheduler.last_epoch == epoch_before
    assert worker.trainer.optimizer.param_groups[0]["lr"] == lr_before
    assert all(p.grad is None for p in worker.model.parameters()) and worker.model.training
    assert "grad_norm" not in evaluated
    trained = worker.train(meta, loss)  # the same loss, computed before its step
    assert set(evaluated) == set(trained) - {"grad_norm"}
    for k in evaluated:
        if k != "lr":
            assert abs(evaluated[k] - trained[k]) < 1e-5, (k, evaluated[k], trained[k])
    assert any(not torch.equal(v, before[k]) for k, v in worker.model.state_dict().items())


def test_the_driver_side_calls_pass_only_the_sizes_given_and_time_themselves():
    from rlplane.training.components import DataPlanePolicy
    from rlplane.training.loop import Timer

    class Group:
        def __init__(self):
            self.calls = []

        def run_sharded(self, method, meta, batch_size=None, **kwargs):
            self.calls.append((method.__name__, batch_size, kwargs))
            return [{}]

    group, timer = Group(), Timer()
    policy = DataPlanePolicy(group, train_global_batch_size=8)
    policy.get_logprobs_from_meta("m")
    policy.get_logprobs_from_meta("m", micro_batch_size=2, timer=timer)
    policy.get_reference_policy_logprobs_from_meta("m", 3)
    policy.train_from_meta("m", "loss")
    policy.train_from_meta("m", "loss", eval_mode=True, gbs=4, mbs=1, timer=timer)
    assert group.calls == [
        ("compute_logprobs", None, {"out_field": "prev_logprobs"}),
        ("compute_logprobs", None, {"out_field": "prev_logprobs", "micro_batch_size": 2}),
        ("compute_logprobs", None, {"out_field": "reference_policy_logprobs", "reference": True,
                                    "micro_batch_size": 3}),
        ("train", 8, {"loss": "loss"}),
        ("train", 4, {"loss": "loss", "eval_mode": True, "gbs": 4, "mbs": 1}),
    ]
    assert set(timer.times) == {"policy_logprobs", "policy_training"}
