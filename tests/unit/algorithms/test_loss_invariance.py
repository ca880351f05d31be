"""Splitting a global batch into micro-batches or DP ranks changes neither the loss nor the gradient,
and the vectorized loss matches its loop twin."""

from __future__ import annotations

import pytest
import torch

from rlplane.algorithms import ClippedPGOptions, clipped_pg_loss, nll_loss, value_loss
from rlplane.algorithms._reference import pg_loss_loop
from rlplane.algorithms.losses import CLIPPED_PG_METRIC_REDUCTIONS

OPTION_SETS = {
    "grpo_default": dict(),
    "dapo": dict(ratio_clip_max=0.28, ratio_clip_c=3.0, reference_policy_kl_penalty=0.0),
    "seq_level": dict(token_level_loss=False),
    "gspo": dict(token_level_loss=False, sequence_level_importance_ratios=True,
                 use_importance_sampling_correction=True),
    "is_tis_k1_onpolicy": dict(
        use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=1.2, reference_policy_kl_type="k1", use_on_policy_kl_approximation=True,
    ),
    "icepop_cispo": dict(
        use_cispo=True, use_importance_sampling_correction=True, truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=1.3, truncated_importance_sampling_ratio_min=0.7,
    ),
    "seq_mask_tis_reinforce": dict(
        disable_ppo_ratio=True, use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio=1.1,
        truncated_importance_sampling_ratio_min=0.9,
    ),
}


def make_batch(b=8, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prev = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    data = dict(
        curr=prev + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64),
        prev=prev,
        gen=prev + 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64),
        ref=prev + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64),
        adv=torch.randn(b, t, generator=g, dtype=torch.float64),
        tm=(torch.rand(b, t, generator=g) > 0.3).double(),
        sm=(torch.rand(b, generator=g) > 0.2).double(),
    )
    data["tm"][0] = 0.0  # one fully masked row
    return data


def run_split(data, opts, splits):
    """Total loss, gradient and metrics over micro-batches given as index tensors."""
    curr = data["curr"].clone().requires_grad_(True)
    n_tok = (data["tm"] * data["sm"][:, None]).sum()
    n_seq = data["sm"].sum()
    total, metrics = 0.0, {}
    for idx in splits:
        loss, m = clipped_pg_loss(
            curr_logprobs=curr[idx], prev_logprobs=data["prev"][idx], generation_logprobs=data["gen"][idx],
            reference_logprobs=data["ref"][idx], advantages=data["adv"][idx], token_mask=data["tm"][idx],
            sample_mask=data["sm"][idx], global_valid_tokens=n_tok, global_valid_seqs=n_seq,
            options=ClippedPGOptions(**opts),
        )
        loss.backward()
        total = total + loss.detach()
        for k, v in m.items():
            how = CLIPPED_PG_METRIC_REDUCTIONS[k]
            if k not in metrics:
                metrics[k] = v
            elif how == "sum":
                metrics[k] = metrics[k] + v
            else:
                metrics[k] = torch.minimum(metrics[k], v) if how == "min" else torch.maximum(metrics[k], v)
    return total, curr.grad, metrics


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_microbatch_and_dp_split_invariance(name):
    data = make_batch(seed=list(OPTION_SETS).index(name))
    opts = OPTION_SETS[name]
    b = data["curr"].shape[0]
    full_loss, full_grad, full_m = run_split(data, opts, [torch.arange(b)])
    layouts = {
        "2 micro-batches": list(torch.arange(b).chunk(2)),
        "4 micro-batches": list(torch.arange(b).chunk(4)),
        # 2 DP ranks, each with 2 micro-batches of a strided shard; gradients all-reduced with SUM
        "2 dp ranks": [torch.tensor([0, 2]), torch.tensor([4, 6]), torch.tensor([1, 3]), torch.tensor([5, 7])],
    }
    for layout, splits in layouts.items():
        loss, grad, m = run_split(data, opts, splits)
        torch.testing.assert_close(loss, full_loss, msg=lambda s, layout=layout: f"{layout}: {s}")
        torch.testing.assert_close(grad, full_grad, msg=lambda s, layout=layout: f"{layout}: {s}")
        for k in full_m:
            torch.testing.assert_close(m[k], full_m[k], msg=lambda s, k=k, layout=layout: f"{layout} {k}: {s}")


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 6), (16, 32)])
@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_pg_loss_matches_loop_twin(shape, token_level, clip_c):
    data = make_batch(*shape, seed=shape[0] + shape[1])
    n_tok = float((data["tm"] * data["sm"][:, None]).sum()) or 1.0
    n_seq = float(data["sm"].sum()) or 1.0
    loss, _ = clipped_pg_loss(
        curr_logprobs=data["curr"], prev_logprobs=data["prev"], advantages=data["adv"] * 2, token_mask=data["tm"],
        sample_mask=data["sm"], global_valid_tokens=n_tok, global_valid_seqs=n_seq,
        options=ClippedPGOptions(reference_policy_kl_penalty=0.0, ratio_clip_c=clip_c, token_level_loss=token_level),
    )
    ref = pg_loss_loop(
        data["curr"], data["prev"], data["adv"] * 2, data["tm"], data["sm"], n_tok, n_seq,
        eps_low=0.2, eps_high=0.2, clip_c=clip_c, token_level=token_level,
    )
    torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float64))


def test_nll_and_value_loss_split_invariance():
    data = make_batch()
    n_tok = (data["tm"] * data["sm"][:, None]).sum()
    g = torch.Generator().manual_seed(3)
    values = torch.randn(8, 6, generator=g, dtype=torch.float64)
    old, ret = values + 0.3 * torch.randn(8, 6, generator=g,
                                          dtype=torch.float64), torch.randn(8, 6, generator=g, dtype=torch.float64)
    for fn in ("nll", "value"):
        results = []
        for splits in ([torch.arange(8)], list(torch.arange(8).chunk(4))):
            x = (data["curr"] if fn == "nll" else values).clone().requires_grad_(True)
            total = 0.0
            for idx in splits:
                if fn == "nll":
                    loss, _ = nll_loss(x[idx], data["tm"][idx], n_tok, sample_mask=data["sm"][idx])
                else:
                    loss, _ = value_loss(x[idx], old[idx], ret[idx], data["tm"][idx], n_tok, 0.2,
                                         sample_mask=data["sm"][idx])
                loss.backward()
                total = total + loss.detach()
            results.append((total, x.grad))
        torch.testing.assert_close(results[0][0], results[1][0])
        torch.testing.assert_close(results[0][1], results[1][1])
