"""Multi-turn rollouts on the embedded tiny model: masks, logprob alignment, reward sums, truncation,
and environments that raise."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.data.datum import make_prompt_datum
from rlplane.dataplane import make_data_plane
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, last_assistant_content, register_env
from rlplane.models.configured import load_configured_policy
from rlplane.workers.logprobs import token_logprobs
from tests.tiny import rollout_worker

OBSERVATION = "=1+"  # three tokens of the char tokenizer
FIELDS = ["input_ids", "token_mask", "generation_logprobs"]


class ThreeTurnEnv:
    """Reward 1.0 per turn; terminates on the third; remembers every response it saw."""

    seen: list[list[str]] = []

    def step(self, message_logs, metadata):
        turns = [m.get("turn", 0) + 1 for m in metadata]
        ThreeTurnEnv.seen.append([last_assistant_content(log) for log in message_logs])
        n = len(message_logs)
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": OBSERVATION}] * n,
            metadata=[{**m, "turn": t} for m, t in zip(metadata, turns)],
            next_stop_strings=[None] * n,
            rewards=torch.ones(n),
            terminateds=torch.tensor([t >= 3 for t in turns]),
            answers=None,
        )


class BrokenEnv(ThreeTurnEnv):
    """Crashes on any batch that holds a "5+6=" problem; scores the others like ThreeTurnEnv."""

    def step(self, message_logs, metadata):
        if any(log[0]["content"] == "5+6=" for log in message_logs):
            raise RuntimeError("verifier crashed")
        return super().step(message_logs, metadata)


@pytest.fixture
def envs():
    saved = dict(ENV_REGISTRY)
    ThreeTurnEnv.seen = []
    register_env("three_turns", ThreeTurnEnv)
    register_env("broken", BrokenEnv)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def _setup(max_total: int, turns: int = 3):
    cfg = load_config(None, [f"grpo.max_rollout_turns={turns}", f"policy.max_total_sequence_length={max_total}",
                             "policy.generation.max_new_tokens=4"])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    dp = make_data_plane("memory")
    dp.register_partition("train", FIELDS, 64)
    return cfg, model, tok, dp, rollout_worker(cfg, dp, model=model, tokenizer=tok, seed=5)


def _datums(tok, problems, task="three_turns"):
    return [make_prompt_datum(p, "0", tok, idx=i, task_name=task) for i, p in enumerate(problems)]


def _columns(dp, meta):
    cols = dp.get_samples(meta, "train", FIELDS)
    return [(cols["input_ids"][i, :n], cols["token_mask"][i, :n], cols["generation_logprobs"][i, :n])
            for i, n in enumerate(meta.seq_lens)]


def _runs(mask: torch.Tensor, value: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of ``value`` in a 1-D mask."""
    runs, start = [], None
    for t, m in enumerate(mask.tolist() + [None]):
        if m == value and start is None:
            start = t
        elif m != value and start is not None:
            runs.append((start, t))
            start = None
    return runs


def test_three_turn_rollout_masks_logprobs_and_rewards(envs):
    cfg, model, tok, dp, worker = _setup(max_total=64)
    datums = _datums(tok, ["12+34=", "5+6=", "99+1="])
    meta, carry, metrics = worker.rollout(datums, group_size=4, partition_id="train")
    obs_ids = tok(OBSERVATION, add_special_tokens=False)["input_ids"]
    # Rewards accumulate: 1 per turn over three turns.
    assert carry["rewards"].tolist() == [3.0] * 12
    assert metrics["avg_turns_per_sample"] == 3.0 and metrics["natural_termination_rate"] == 1.0
    assert metrics["mean_env_tokens_per_sample"] == 2 * len(obs_ids)
    assert metrics["truncation_rate"] == 0.0 and max(meta.seq_lens) < 64  # room to spare: nothing cut
    responses = list(zip(*ThreeTurnEnv.seen))  # per sample, its three responses as the env saw them
    gen_tokens = []
    for i, (ids, mask, lp) in enumerate(_columns(dp, meta)):
        prompt = datums[i // 4].prompt_token_ids
        assert ids[: len(prompt)].tolist() == prompt and not mask[: len(prompt)].any()
        # Three generated runs, separated by exactly the observation tokens, which are masked out.
        gen_runs = _runs(mask, 1)
        assert len(gen_runs) == 3
        gaps = [ids[a:b].tolist() for a, b in _runs(mask, 0)[1:]]
        assert gaps == [obs_ids, obs_ids]
        decoded = [tok.decode(ids[a:b].tolist(), skip_special_tokens=True) for a, b in gen_runs]
        assert decoded == list(responses[i])
        assert bool((lp[mask == 0] == 0).all())
        gen_tokens.append(int(mask.sum()))
    assert metrics["mean_gen_tokens_per_sample"] == pytest.approx(sum(gen_tokens) / 12)
    assert carry["response_lengths"].tolist() == [n - p for n,
                                                  p in zip(meta.seq_lens, carry["prompt_lengths"].tolist())]
    # The sampler's logprobs line up with the generated tokens: a fresh forward pass over the whole
    # conversation gives the same logprob at every masked-in position.
    for ids, mask, lp in _columns(dp, meta):
        recomputed = token_logprobs(model, ids[None], torch.ones_like(ids)[None], temperature=1.0)[0]
        on = mask.bool()
        torch.testing.assert_close(lp[on], recomputed[on].detach(), atol=1e-4, rtol=0)


def test_truncation_at_the_maximum_length_is_marked(envs):
    cfg, model, tok, dp, worker = _setup(max_total=14)
    datums = _datums(tok, ["12+34="])  # 7 prompt tokens: room for 7 more
    meta, carry, metrics = worker.rollout(datums, group_size=8, partition_id="train")
    assert max(meta.seq_lens) <= 14
    for (ids, mask, lp), n, trunc, reward in zip(_columns(dp, meta), meta.seq_lens, carry["truncated"].tolist(),
                                                   carry["rewards"].tolist()):
        turns = len(_runs(mask, 1))
        assert reward == float(turns)  # one per completed turn, none after the cut
        if turns < 3:  # stopped before the env terminated it: only the length limit can have done that
            assert trunc and n == 14
        assert bool((lp[mask == 0] == 0).all())
    assert carry["truncated"].any() and metrics["truncation_rate"] > 0
    assert metrics["natural_termination_rate"] + metrics["truncation_rate"] >= 1.0


def test_turn_limit_and_failing_environment(envs):
    cfg, model, tok, dp, worker = _setup(max_total=64, turns=2)
    datums = _datums(tok, ["1+2=", "3+4="]) + _datums(tok, ["5+6=", "7+8="], task="broken")
    meta, carry, metrics = worker.rollout(datums, group_size=2, partition_id="train")
    # Two turns of the three-turn env: reward 2, stopped by the turn limit. The broken env's batch is
    # retried sample by sample: only the samples it crashes on fail (reward 0), the others score.
    assert carry["rewards"].tolist() == [2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert metrics["env_errors"] == 2.0 and metrics["env_error_rate"] == pytest.approx(2 / 8)
    assert metrics["max_turns_reached_rate"] == pytest.approx(6 / 8)
    assert len(meta) == 8  # the step goes on with every sample written


class MalformedEnv(ThreeTurnEnv):
    """Scores like ThreeTurnEnv but breaks its return for "5+6=" problems, in the way ``kind`` says."""

    kind = "observation"

    def step(self, message_logs, metadata):
        ret = super().step(message_logs, metadata)
        bad = [j for j, log in enumerate(message_logs) if log[0]["content"] == "5+6="]
        if not bad:
            return ret
        if MalformedEnv.kind == "observation":  # a bare string where the message dict belongs
            obs = list(ret.observations)
            for j in bad:
                obs[j] = "=1+"
            return ret._replace(observations=obs)
        if MalformedEnv.kind == "metadata":  # one metadata entry short
            return ret._replace(metadata=ret.metadata[:-1])
        if MalformedEnv.kind == "rewards":  # one reward too many
            return ret._replace(rewards=torch.cat([ret.rewards, torch.ones(1)]))
        if MalformedEnv.kind == "nan_reward":
            rewards = ret.rewards.clone()
            rewards[bad] = float("nan")
            return ret._replace(rewards=rewards)
        return None  # "none": not an EnvironmentReturn at all


@pytest.mark.parametrize("kind", ["observation", "metadata", "rewards", "nan_reward", "none"])
def test_malformed_environment_return_fails_only_its_samples(envs, kind, caplog):
    """Issue 16 item 13a: a malformed return used to fail the whole rollout (AttributeError on a
    str observation, IndexError on short metadata) or pass unnoticed; now only the samples it is
    malformed for fail (reward 0, env_errors), with one warning line that says why."""
    MalformedEnv.kind = kind
    register_env("malformed", MalformedEnv)
    cfg, model, tok, dp, worker = _setup(max_total=64, turns=2)
    datums = _datums(tok, ["1+2="]) + _datums(tok, ["5+6=", "7+8="], task="malformed")
    with caplog.at_level("WARNING", logger="rlplane.workers.turns"):
        meta, carry, metrics = worker.rollout(datums, group_size=2, partition_id="train")
    # Two turns of reward 1 for the good samples; the "5+6=" pair fails on its first turn.
    assert carry["rewards"].tolist() == [2.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert metrics["env_errors"] == 2.0 and len(meta) == 6
    lines = [r.getMessage() for r in caplog.records if r.name == "rlplane.workers.turns"]
    assert len(lines) == 1 and "environment 'malformed' failed on 2 of 4 samples" in lines[0], lines
    why = {"observation": "observations[0] is a str, not a dict", "metadata": "0 metadata for 1 samples",
           "rewards": "2 rewards for 1 samples", "nan_reward": "rewards[0] = nan",
           "none": "returned a NoneType, not an EnvironmentReturn"}[kind]
    assert why in lines[0], lines[0]


def test_grpo_calculator_preset_runs_multi_turn(tmp_path):
    """The tool-use preset end to end (tiny sizes): the turn metrics are logged and finite."""
    import math

    from rlplane.recipes.grpo import train
    from rlplane.utils.logging import read_metrics

    cfg = load_config("grpo_calculator", [
        f"run_dir={tmp_path}", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=32", "policy.train_micro_batch_size=32", "policy.logprob_batch_size=32",
        "grpo.max_num_steps=2", "grpo.val_period=2", "grpo.max_val_samples=16", "grpo.val_batch_size=16",
        "warmup.num_steps=4", "warmup.target_accuracy=null", "warmup.eval_every=4", "warmup.eval_samples=8",
        "logger.progress_bar=false", "logger.tensorboard_enabled=false", "checkpointing.enabled=false",
    ])
    train(cfg, quiet=True)
    steps = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert len(steps) == 2
    for r in steps:
        for key in ("avg_turns_per_sample", "natural_termination_rate", "truncation_rate", "max_turns_reached_rate",
                    "mean_gen_tokens_per_sample", "mean_env_tokens_per_sample", "env_error_rate", "loss"):
            assert math.isfinite(r[f"train/{key}"]), key
        assert 1.0 <= r["train/avg_turns_per_sample"] <= 2.0


def test_single_turn_is_one_generate_call_as_before(envs):
    """max_rollout_turns = 1 reproduces the single-turn rollout exactly: one generate call with the
    same arguments (same per-sample seeds), prompt + response columns, the env's reward."""
    from rlplane.generation.sampling import sample_seed
    from rlplane.workers.rollout import sample_keys

    cfg, model, tok, dp, worker = _setup(max_total=32, turns=1)
    datums = _datums(tok, ["12+34=", "5+6=", "99+1="])
    meta, carry, metrics = worker.rollout(datums, group_size=4, partition_id="train")
    gen = cfg.policy.generation
    prompts = [d.prompt_token_ids for d in datums for _ in range(4)]
    out = worker.backend.generate(
        prompts, max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k,
        greedy=False, stop_strings=gen.stop_strings,
        row_seeds=[sample_seed(cfg.loop.seed, k, 0) for k in sample_keys(datums, 4, "train")],
    )
    for (ids, mask, lp), p, o, olp in zip(_columns(dp, meta), prompts, out.output_ids, out.logprobs):
        assert ids.tolist() == p + o
        assert mask.tolist() == [0] * len(p) + [1] * len(o)
        assert torch.equal(lp, torch.cat([torch.zeros(len(p)), olp]))
    assert carry["rewards"].tolist() == [1.0] * 12 and metrics["avg_turns_per_sample"] == 1.0
    assert carry["truncated"].tolist() == [r == "length" for r in out.finish_reasons]
