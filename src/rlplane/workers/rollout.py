"""The rollout worker: generation plus environments, writing each sample's columns to the data plane.

For each prompt it draws ``group_size`` responses, scores them with the environment named by the
prompt's ``task_name``, mints one key per sample (``{prompt_uid}_g{i}``) and writes the bulk
columns under those keys in one put. The driver gets back the receipt (:class:`KVBatchMeta`) and a
small per-row carry: rewards, group index, truncation, lengths. Nothing else crosses to the driver.

Columns written (per-token ones are jagged, length = prompt + response):
  input_ids            prompt + response token ids
  token_mask           1 on response tokens (the ones trained on), 0 on prompt tokens
  generation_logprobs  logprob of each response token under the sampler, 0 on prompt tokens
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import torch

from rlplane.config.schema import RunConfig
from rlplane.data.datum import DatumSpec
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.envs import create_env
from rlplane.generation import create_backend
from rlplane.workers.base import load_configured_policy


class RolloutWorker:
    def __init__(self, cfg: RunConfig, data_plane: DataPlaneClient | None, model=None, tokenizer=None, seed: int = 0):
        self.cfg, self.dp = cfg, data_plane
        torch.set_num_threads(cfg.policy.threads_per_worker)
        if model is None:
            model, tokenizer = load_configured_policy(cfg)
        self.tokenizer = tokenizer
        self.backend = create_backend(cfg.policy.generation.backend, model, tokenizer)
        self.generator = torch.Generator().manual_seed(seed)
        self._envs: dict[str, object] = {}

    # ---- weights and RNG -------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.backend.update_weights(state_dict)

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # ---- rollout ---------------------------------------------------------------------------------
    def _env(self, task_name: str):
        if task_name not in self._envs:
            self._envs[task_name] = create_env(task_name, **self.cfg.env.env_kwargs(task_name))
        return self._envs[task_name]

    def _score(self, datums: Sequence[DatumSpec], responses: list[str]) -> torch.Tensor:
        """Route each sample to its environment by task_name; return (B,) rewards."""
        rewards = torch.zeros(len(datums))
        by_task: dict[str, list[int]] = {}
        for i, d in enumerate(datums):
            by_task.setdefault(d.task_name, []).append(i)
        for task, rows in by_task.items():
            logs = [
                [*datums[i].message_log, {"role": "assistant", "content": responses[i]}] for i in rows
            ]
            ret = self._env(task).step(logs, [datums[i].extra_env_info for i in rows])
            rewards[rows] = torch.as_tensor(ret.rewards, dtype=torch.float32)
        return rewards

    def rollout(
        self,
        datums: Sequence[DatumSpec],
        *,
        group_size: int,
        partition_id: str | None,
        greedy: bool = False,
    ) -> tuple[KVBatchMeta | None, dict[str, torch.Tensor], dict[str, float]]:
        """Generate ``group_size`` responses per datum and score them.

        With a ``partition_id`` the columns go to the data plane and the receipt is returned;
        without one (validation) only the carry comes back.
        """
        gen = self.cfg.policy.generation
        rows = [d for d in datums for _ in range(group_size)]
        prompts = [d.prompt_token_ids for d in rows]
        max_total = self.cfg.policy.max_total_sequence_length
        max_new = min(gen.max_new_tokens, max_total - max(len(p) for p in prompts))
        out = self.backend.generate(
            prompts,
            max_new_tokens=max_new,
            temperature=gen.temperature,
            top_p=gen.top_p,
            top_k=gen.top_k,
            greedy=greedy,
            stop_strings=gen.stop_strings,
            generator=self.generator,
        )
        responses = self.tokenizer.batch_decode(out.output_ids, skip_special_tokens=True)
        rewards = self._score(rows, responses)
        prompt_lens = torch.tensor([len(p) for p in prompts])
        resp_lens = torch.tensor([len(o) for o in out.output_ids])
        carry = {
            "rewards": rewards,
            "group": torch.arange(len(datums)).repeat_interleave(group_size),
            "truncated": torch.tensor([r == "length" for r in out.finish_reasons]),
            "loss_multiplier": torch.tensor([d.loss_multiplier for d in rows], dtype=torch.float32),
            "prompt_lengths": prompt_lens,
            "response_lengths": resp_lens,
        }
        metrics = {"mean_gen_tokens_per_sample": float(resp_lens.float().mean())}
        if partition_id is None:
            return None, carry, metrics
        input_ids, token_mask, gen_lp = [], [], []
        for p, o, lp in zip(prompts, out.output_ids, out.logprobs):
            input_ids.append(torch.tensor(list(p) + list(o), dtype=torch.long))
            token_mask.append(torch.cat([torch.zeros(len(p), dtype=torch.int8), torch.ones(len(o), dtype=torch.int8)]))
            gen_lp.append(torch.cat([torch.zeros(len(p)), lp.float()]))
        uids = [uuid.uuid4().hex[:12] for _ in datums]
        keys = [f"{uids[i // group_size]}_g{i % group_size}" for i in range(len(rows))]
        meta = self.dp.put_samples(
            keys,
            partition_id,
            {"input_ids": input_ids, "token_mask": token_mask, "generation_logprobs": gen_lp},
            tags=[{"sample_mask": float(m)} for m in carry["loss_multiplier"].tolist()],
        )
        return meta, carry, metrics
