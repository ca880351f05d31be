"""The collector hosted in a child process (``runtime: local``, ``grpo.async_grpo.collector_process``):
its groups land in the parent's memory plane, a refit reaches it through shared memory, its
checkpoint is written and restored from there, and it ends with close."""

from __future__ import annotations

import time

import torch

from rlplane.async_rl import AsyncOptions, AsyncTrajectoryCollector
from rlplane.dataplane import concat_metas, make_data_plane
from rlplane.dataplane.columns import GENERATION_LOGPROBS, INPUT_IDS, ROLLOUT_COLUMNS, TOKEN_MASK
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy
from rlplane.runtime.groups import make_actor
from rlplane.training.plan import rollout_options
from rlplane.workers.environments import EnvBlock

from .collector_helpers import G, P, make_cfg


def start_collector(plane, start_version=0, state_file=None):
    cfg = make_cfg()
    _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    actor = make_actor("local", AsyncTrajectoryCollector,
                       dict(rollout=rollout_options(cfg), env=EnvBlock(cfg.env), loader=loader,
                            start_version=start_version, seed=0, data_plane=plane, partition_id="train",
                            options=AsyncOptions.from_config(cfg.grpo)),
                       process=True)
    restored = actor.call(AsyncTrajectoryCollector.load_state, state_file, start_version) if state_file else None
    actor.call(AsyncTrajectoryCollector.start)
    return actor, restored


def wait_generated(actor, n, timeout=60.0):
    t0 = time.monotonic()
    while actor.call(AsyncTrajectoryCollector.stats)["groups_generated"] < n:
        assert actor.call(AsyncTrajectoryCollector.health) is None, actor.call(AsyncTrajectoryCollector.health)
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_groups_refits_and_checkpoints_cross_the_process_boundary(tmp_path):
    plane = make_data_plane("memory")  # the driver's plane; the child writes into it
    actor, _ = start_collector(plane)
    try:
        wait_generated(actor, 2 * P)  # version 0 serves steps 0 and 1
        first = actor.call(AsyncTrajectoryCollector.sample, P, 0, 10.0)
        assert [g.generation_version for g in first.groups] == [0] * P
        meta = concat_metas([g.meta for g in first.groups])
        cols = plane.get_samples(meta, None, list(ROLLOUT_COLUMNS))  # read here, written there
        n = meta.seq_lens[0]
        tm, lp = cols[TOKEN_MASK][0, :n], cols[GENERATION_LOGPROBS][0, :n]
        assert cols[INPUT_IDS].shape[0] == P * G and (lp[tm == 0] == 0).all() and (lp[tm == 1] < 0).all()
        carry = torch.cat([g.carry["generated_tokens"] for g in first.groups])
        assert carry.tolist() == cols[TOKEN_MASK].sum(dim=1).tolist()

        # A refit through the staged shared-memory buffer; version 1 then serves step 2.
        model, _ = load_configured_policy(make_cfg().policy, seed=7)
        actor.call(AsyncTrajectoryCollector.prepare_for_refit)
        actor.call(AsyncTrajectoryCollector.update_weights, actor.share("weights", model.state_dict()))
        actor.call(AsyncTrajectoryCollector.set_weight_version, 1)
        actor.call(AsyncTrajectoryCollector.resume_after_refit)
        wait_generated(actor, 3 * P)
        second = actor.call(AsyncTrajectoryCollector.sample, P, 1, 10.0)
        assert second.avg_trajectory_age == 1.0

        actor.call(AsyncTrajectoryCollector.save_state, str(tmp_path / "replay_buffer.pt"))
        saved = torch.load(tmp_path / "replay_buffer.pt", weights_only=True)
        buffered = [g["prompt_idx"] for g in saved["replay_buffer"]["groups"]]
        assert buffered  # step 2's groups, their columns read back there from the plane here
        keys = [k for g in saved["replay_buffer"]["groups"] for k in g["keys"]]
        plane.clear_samples(keys, "train")  # as a new run's plane would be: without them
    finally:
        actor.call(AsyncTrajectoryCollector.stop)
        actor.close()
    assert not actor.process.is_alive() and actor.process.exitcode == 0

    # A new collector process restores the buffer: its columns written back into the plane here.
    plane = make_data_plane("memory")
    actor, restored = start_collector(plane, start_version=2, state_file=str(tmp_path / "replay_buffer.pt"))
    try:
        assert restored == (len(buffered), 0)
        third = actor.call(AsyncTrajectoryCollector.sample, P, 2, 10.0)
        assert [g.prompt_idx for g in third.groups] == buffered
        cols = plane.get_samples(concat_metas([g.meta for g in third.groups]), None, [TOKEN_MASK])
        first_group = saved["replay_buffer"]["groups"][0]["columns"][TOKEN_MASK]
        assert [int(r.sum()) for r in first_group] == cols[TOKEN_MASK][:G].sum(dim=1).tolist()
    finally:
        actor.call(AsyncTrajectoryCollector.stop)
        actor.close()
