"""Validation as NeMo RL's validate_sync: the ``val`` partition registered per validation batch and
cleared after it, and the answers shown as text read back from the plane (not the rollout worker's)."""

from __future__ import annotations

import torch

from rlplane.config.loading import load_config
from rlplane.data import make_prompt_datum
from rlplane.dataplane import make_data_plane
from rlplane.dataplane.columns import GENERATION_LOGPROBS, INPUT_IDS, TOKEN_MASK
from rlplane.models import build_char_tokenizer
from rlplane.training.loop import VAL_PARTITION, validate


class _Plane:
    """The memory plane, recording the calls validation makes."""

    def __init__(self):
        self.dp, self.calls = make_data_plane("memory"), []

    def __getattr__(self, name):
        method = getattr(self.dp, name)

        def call(*args, **kwargs):
            self.calls.append((name, args[0] if name == "register_partition" else None))
            return method(*args, **kwargs)

        return call


class _Rollout:
    """Writes '<answer>' then an observation "=" then "9" per prompt into the plane, as a 2-turn rollout."""

    def __init__(self, plane, tok):
        self.plane, self.tok, self.n = plane, tok, 0

    def rollout(self, batch, *, group_size, partition_id, greedy, heldout):
        assert greedy and heldout
        ids, masks, keys = [], [], []
        for d in batch:
            turns = [(d.ground_truth, 1), ("=", 0), ("9", 1)]
            toks = d.prompt_token_ids + [t for text, _ in turns for t in self.tok(text, add_special_tokens=False)
                                         ["input_ids"]]
            mask = [0] * d.length + [m for text, m in turns for _ in self.tok(text, add_special_tokens=False)
                                     ["input_ids"]]
            ids.append(torch.tensor(toks)), masks.append(torch.tensor(mask))
            keys.append(f"v{self.n}"), setattr(self, "n", self.n + 1)
        meta = self.plane.put_samples(keys, partition_id, {INPUT_IDS: ids, TOKEN_MASK: masks,
                                                           GENERATION_LOGPROBS: [m.float() * 0 for m in masks]})
        carry = {"rewards": torch.ones(len(batch)), "prompt_lengths": torch.tensor([d.length for d in batch])}
        return meta, carry, {}


def test_val_partition_per_batch_and_text_from_the_plane():
    tok = build_char_tokenizer()
    datums = [make_prompt_datum(f"{i}+1=", str(i + 1), tok, idx=i, task_name="arithmetic") for i in range(5)]
    loop = load_config(None, ["grpo.val_batch_size=2", "grpo.max_val_samples=5"]).loop
    plane = _Plane()
    metrics, rows = validate(loop, _Rollout(plane, tok), datums, plane, tok)
    # Every reply ends on "9" (one answer for all 5: share 5/5); the references 1..5 each appear once, so one
    # constant answer would be right on 1 of 5 = 0.2.
    assert metrics == {"accuracy": 1.0, "top_answer_share": 1.0, "constant_answer_accuracy": 0.2}
    registers = [arg for name, arg in plane.calls if name == "register_partition"]
    clears = [name for name, _ in plane.calls if name == "clear_samples"]
    assert registers == [VAL_PARTITION] * 3 and len(clears) == 3  # batches of 2, 2, 1
    order = [name for name, _ in plane.calls if name in ("register_partition", "clear_samples")]
    assert order == ["register_partition", "clear_samples"] * 3
    assert plane.dp.list_samples(VAL_PARTITION) == []
    assert rows[3] == {"task_name": "arithmetic", "prompt": "3+1=", "completion": "4\n[observation] =\n9",
                       "reward": 1.0, "ground_truth": "4"}


def test_no_constant_answer_figure_without_reference_answers():
    """A problem without a reference answer (an environment that scores otherwise): the share of the commonest
    answer is still logged, what one constant answer scores is not."""
    tok = build_char_tokenizer()
    datums = [make_prompt_datum(f"{i}+1=", str(i + 1), tok, idx=i, task_name="arithmetic") for i in range(3)]
    loop = load_config(None, ["grpo.val_batch_size=3", "grpo.max_val_samples=3"]).loop
    plane = _Plane()
    rollout = _Rollout(plane, tok)
    real_rollout = rollout.rollout

    def rollout_then_lose_one(batch, **kw):  # the rollout writes each reference as its reply; then one goes missing
        out = real_rollout(batch, **kw)
        datums[1].extra_env_info["ground_truth"] = None
        return out

    rollout.rollout = rollout_then_lose_one
    metrics, _ = validate(loop, rollout, datums, plane, tok)
    assert metrics == {"accuracy": 1.0, "top_answer_share": 1.0}  # every reply ends on "9"
