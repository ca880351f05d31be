"""The rollout worker: generation plus environments, writing each sample's columns to the data plane.

Per prompt it draws ``group_size`` responses, scores them with the prompt's environment (over turns:
:mod:`rlplane.workers.turns`) and writes ``ROLLOUT_COLUMNS`` under one key per sample in one put; the
driver gets the receipt and a small (B,) carry (rewards, group, truncation, failure, lengths,
``reward/<name>``). Failed environment steps follow ``rollout_failure_policy``. Sampling is seeded per
sample key and weight version (``hf``), so a sample draws the same tokens wherever it is generated.
Phases for callers that interleave work: ``generate``, ``score``, ``finish``, ``put``.
Environments run here, or under ``runtime: ray`` in the driver's actor pools (:mod:`rlplane.workers.environments`);
each task's ``metrics()`` is reported as ``env/<task>/*``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlplane.data.datum import DatumSpec
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.dataplane.columns import GENERATION_LOGPROBS, INPUT_IDS, TOKEN_MASK
from rlplane.envs.interface import EnvBatch
from rlplane.errors import WorkerFailed
from rlplane.fast.threads import set_worker_threads
from rlplane.generation import create_backend
from rlplane.generation.interface import stop_ids
from rlplane.generation.sampling import sample_seed
from rlplane.models.configured import load_configured_policy
from rlplane.models.precision import hidden_size_of
from rlplane.runtime.env_pools import call_env_metrics
from rlplane.runtime.shared_paths import SharedPaths, check_shared_paths
from rlplane.utils.kill_points import kill_point
from rlplane.workers.env_metrics import env_metrics
from rlplane.workers.environments import EnvBlock, Environments
from rlplane.workers.turns import Turns, TurnsResult, generate_turns, score_turns, turns_result
from rlplane.workers.weight_sync import GeneratorReport, model_precision, run_probe

if TYPE_CHECKING:
    from rlplane.config.policy import PolicyConfig

ENV_GROUPS = "env_groups"  # finish(per_group=True): each prompt group's env/<task>/* metrics, in order


def group_keys(num_groups: int, group_size: int) -> list[str]:
    """Fresh data-plane keys for ``num_groups`` prompt groups: ``{prompt_uid}_g{i}``, group-major."""
    uids = [uuid.uuid4().hex[:12] for _ in range(num_groups)]
    return [f"{uid}_g{i}" for uid in uids for i in range(group_size)]


def sample_keys(datums: Sequence[DatumSpec], group_size: int, stream: str) -> list[str]:
    """The sampling key of each row, group-major: ``{stream}/e{epoch}/p{idx}_g{i}`` (stable across runs;
    ``stream`` keeps training and held-out prompts apart)."""
    return [f"{stream}/e{d.epoch}/p{d.idx}_g{i}" for d in datums for i in range(group_size)]


@dataclass(frozen=True)
class RolloutOptions:
    """What a rollout worker takes from the run's config (the run plan builds it, :mod:`rlplane.training.plan`)."""

    policy: PolicyConfig  # the model a worker without one loads; its generation section; the sequence cap
    seed: int  # the run's seed: the model's initialisation, and the per-row sampling seeds of every worker
    max_rollout_turns: int
    env_retries: int = 0  # re-runs of a failed environment step (rollout_failure_policy: retry)


class RolloutWorker:
    """``options``: its own settings; ``env``: the environments it steps; ``model``/``tokenizer``: a module to sample
    from (the policy's own, colocated), else it loads its own copy; ``seed``: its generator's (engines without
    per-row seeds)."""

    def __init__(self, options: RolloutOptions, env: EnvBlock, data_plane: DataPlaneClient | None, model=None,
                 tokenizer=None, seed: int = 0, shared_paths: SharedPaths | None = None):
        p = options.policy
        # First: a run directory or model this worker cannot see is one line, not a traceback.
        check_shared_paths(shared_paths, "rollout worker", p.model_name)
        self.options, self.dp = options, data_plane
        if model is None:
            model, tokenizer = load_configured_policy(p, options.seed)
        set_worker_threads(p.threads_per_worker, hidden_size_of(model))
        self.tokenizer = tokenizer
        g = self.generation = p.generation
        # vllm_cfg (NeMo RL's engine keys) reach the vllm engine; hf gets its choice of forward.
        engine = ({**g.vllm_cfg.model_dump(), "engine_kwargs": dict(g.vllm_kwargs)} if g.backend == "vllm"
                  else {"decode": g.hf_decode, "max_batch_size": p.generation_batch_size})
        self.backend = create_backend(g.backend, model, tokenizer, **engine)
        self.generator = torch.Generator().manual_seed(seed)  # backends without per-row seeds (vllm)
        self.weight_version = 0  # the version the rollouts are seeded with; the trainer sets it
        self.envs = Environments(env, retries=options.env_retries)
        self._refit_names: list[str] | None = None  # the names the last refit sent (what the fingerprint covers)
        self._held_before: int | None = None  # the version held before the last refit
        self._last: tuple[list[DatumSpec], list] = ([], [])  # the last rollout's rows and states (last_samples)

    def ping(self) -> int:
        """Answers once the constructor has finished (under Ray, raises what it raised)."""
        return 0

    # ---- weights and RNG
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int | None:
        """Load the policy's weights (waking the engine); ``version`` stamps the tokens they sample.
        Returns the version held before (None: never refit)."""
        held = self._held_before = getattr(self.backend, "weight_version", None)
        self._refit_names = list(state_dict)
        if version is None:
            self.backend.update_weights(state_dict)
        else:
            self.backend.update_weights(state_dict, version=version)
        return held

    def weight_report(self, probe: bool = True, fingerprint: bool = True) -> GeneratorReport:
        """What the engine holds now: version, fingerprint over the last refit's names, the probe (weight_sync.py)."""
        return GeneratorReport(
            version=getattr(self.backend, "weight_version", None),
            fingerprint=self.backend.fingerprint(self._refit_names) if fingerprint else None,
            precision=model_precision(getattr(self.backend, "model", None)),
            probe=run_probe(self.backend, self.tokenizer, self.generation) if probe else None,
            previous_version=self._held_before,
        )

    def sleep(self) -> None:
        """Release the engine's memory until :meth:`update_weights` (colocated: the policy trains meanwhile);
        vLLM only with ``vllm_cfg.enable_sleep_mode``."""
        self.backend.sleep()

    def num_weights_held(self) -> int:
        """Parameter elements the engine's model holds now (0 while asleep)."""
        model = getattr(self.backend, "model", None)
        return sum(p.numel() for p in model.parameters()) if model is not None else 0

    def placement(self) -> dict:
        """Under Ray: the node, placement group and bundle this actor runs in."""
        from rlplane.runtime.placement import current_placement

        return current_placement()

    def set_weight_version(self, version: int) -> None:
        """The weight version the next rollouts are seeded with (the step whose weights sample them)."""
        self.weight_version = int(version)

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    def close(self) -> None:
        """Close the environments that hold resources (verifier or sandbox worker processes)."""
        self.envs.close()

    def last_samples(self, limit: int | None = None) -> list[dict]:
        """The last rollout's samples as text: task, prompt, completion (roles tagged), reward, reference."""
        rows, states = self._last
        out = []
        for d, st in list(zip(rows, states))[:limit]:
            turns = [m.get("content", "") if m.get("role") == "assistant" else f"[{m.get('role')}] {m.get('content')}"
                     for m in st.message_log[len(d.message_log):]]
            out.append({"task_name": d.task_name, "prompt": "".join(m.get("content", "") for m in d.message_log),
                        "completion": "\n".join(turns), "reward": float(st.reward), "ground_truth": d.ground_truth})
        return out

    # ---- rollout
    def rollout(
        self,
        datums: Sequence[DatumSpec],
        *,
        group_size: int,
        partition_id: str | None,
        greedy: bool = False,
        weight_version: int | None = None,
        keys: Sequence[str] | None = None,
        heldout: bool = False,
    ) -> tuple[KVBatchMeta | None, dict[str, torch.Tensor], dict[str, float]]:
        """Generate ``group_size`` responses per datum and score them over up to ``max_rollout_turns`` turns.

        With ``partition_id`` the columns go to the data plane under ``keys`` (default: :func:`group_keys`)
        and the receipt is returned; without, only the carry. Seeds come from :func:`sample_keys` and
        ``weight_version``; ``heldout`` prompts draw from their own stream.
        """
        if keys is not None and len(keys) != len(datums) * group_size:
            raise ValueError(f"rollout: {len(keys)} keys for {len(datums)} prompts × {group_size} samples")
        generated = self.generate(datums, group_size=group_size, greedy=greedy, weight_version=weight_version,
                                  heldout=heldout or partition_id is None)
        result, carry, metrics = self.finish(self.score(generated))
        if partition_id is None:
            return None, carry, metrics
        keys = group_keys(len(datums), group_size) if keys is None else keys
        return self.put(result, carry, partition_id, keys), carry, metrics

    def generate(self, datums: Sequence[DatumSpec], *, group_size: int, greedy: bool = False,
                 weight_version: int | None = None, heldout: bool = False, env_slot: int = 0) -> Generated:
        """Phase one: every generate call and the environment steps before the last turn (in ``env_slot``'s
        environment instances)."""
        gen, p = self.generation, self.options.policy
        if getattr(self.backend, "asleep", False):  # a bug in the caller: the refit wakes the engine
            raise RuntimeError("rollout on a sleeping generator: refit it (update_weights) first")
        rows = [d for d in datums for _ in range(group_size)]
        version = self.weight_version if weight_version is None else int(weight_version)
        sampling = {"temperature": gen.temperature, "top_p": gen.top_p, "top_k": gen.top_k}
        if heldout and gen.val_temperature is not None:  # validation samples as NeMo RL's does, never greedily
            greedy = False
            sampling = {"temperature": gen.val_temperature, "top_p": gen.val_top_p or gen.top_p,
                        "top_k": gen.val_top_k if gen.val_top_k is not None else gen.top_k}
        row_seeds = None
        if getattr(self.backend, "supports_row_seeds", False) and not greedy:
            stream = "heldout" if heldout else "train"
            row_seeds = [sample_seed(self.options.seed, k, version) for k in sample_keys(datums, group_size, stream)]
        turns = generate_turns(
            self.backend,
            self.tokenizer,
            rows,
            self.envs.steps(heldout, env_slot),
            max_turns=self.options.max_rollout_turns,
            max_total_sequence_length=p.max_total_sequence_length,
            max_new_tokens=gen.max_new_tokens,
            stop_strings=gen.stop_strings,
            **({"stop_token_ids": stop_ids(self.backend, gen.stop_token_ids)} if gen.stop_token_ids else {}),
            **sampling,
            greedy=greedy,
            generator=self.generator,
            row_seeds=row_seeds,
            generation_timeout_s=gen.timeout_s,
        )
        return Generated(list(datums), rows, group_size, version, turns, heldout)

    def score(self, generated: Generated, env_slot: int = 0) -> Generated:
        """Phase two: the scoring environment step (none if every sample ended early), in ``env_slot``."""
        score_turns(generated.turns, self.envs.steps(generated.heldout, env_slot))
        return generated

    def finish(self, scored: Generated, per_group: bool = False
               ) -> tuple[TurnsResult, dict[str, torch.Tensor], dict[str, Any]]:
        """A scored rollout's per-token columns (:class:`TurnsResult`), (B,) carry and metrics; ``per_group``: the
        environments' metrics of each prompt group apart, a list under ``ENV_GROUPS`` (async GRPO trains groups of
        one batch at different steps)."""
        res = turns_result(scored.turns)
        check_finite_logprobs(res.generation_logprobs, scored.version)
        kill_point("generation")
        rows = scored.rows
        self._last = (rows, res.states)  # for last_samples (sample tables); replaced by the next rollout
        carry = {
            "rewards": res.rewards,
            "group": torch.arange(len(scored.datums)).repeat_interleave(scored.group_size),
            "truncated": res.truncated,
            "env_failed": res.env_failed,  # for rollout_failure_policy: drop_group
            "loss_multiplier": torch.tensor([d.loss_multiplier for d in rows], dtype=torch.float32),
            "prompt_lengths": res.prompt_lengths,
            "response_lengths": res.response_lengths,
            # Trained tokens per sample (async GRPO weighs token ages by them).
            "generated_tokens": torch.tensor([st.gen_tokens for st in res.states]),  # = each token mask's sum
        }
        # Every declared component, 0 where none was given, so batches concatenate.
        declared = {n for task in dict.fromkeys(d.task_name for d in scored.datums)
                    for n in getattr(self.envs.any(task, scored.heldout), "reward_component_names", ())}
        zeros = torch.zeros(len(rows), dtype=torch.float32)
        for name in sorted(declared | set(res.reward_components)):
            carry[f"reward/{name}"] = res.reward_components.get(name, zeros)
        metrics = {**res.metrics, "rollout_failures": res.metrics["env_errors"],
                   "rollout_retries": res.metrics["env_retries"]}
        parts = carry["group"], carry["truncated"], carry["prompt_lengths"], carry["response_lengths"]
        tasks = [d.task_name for d in rows]

        def metrics_of(task):
            return functools.partial(call_env_metrics, self.envs.any(task, scored.heldout))

        if per_group:
            spans = [slice(i * scored.group_size, (i + 1) * scored.group_size) for i in range(len(scored.datums))]
            metrics[ENV_GROUPS] = [env_metrics(tasks[r], res.rewards[r], EnvBatch(*(x[r] for x in parts)), metrics_of)
                                   for r in spans]
        else:
            metrics.update(env_metrics(tasks, res.rewards, EnvBatch(*parts), metrics_of))
        # Actor pools: how many died under this rollout, its steps and metrics() calls (so after those).
        for task in dict.fromkeys(d.task_name for d in rows):
            pool = self.envs.pool(task, scored.heldout)
            if pool is not None:
                metrics[f"env/{task}/actor_deaths"] = float(pool.take_deaths())
        return res, carry, metrics

    def put(self, result: TurnsResult, carry: Mapping[str, torch.Tensor], partition_id: str, keys: Sequence[str],
            columns: Mapping[str, list[torch.Tensor]] | None = None) -> KVBatchMeta:
        """Write a finished rollout's columns (and ``columns``) under ``keys``, group-major; returns the receipt."""
        return self.dp.put_samples(
            list(keys),
            partition_id,
            {INPUT_IDS: result.input_ids, TOKEN_MASK: result.token_mask,
             GENERATION_LOGPROBS: result.generation_logprobs, **(columns or {})},
            tags=[{"sample_mask": float(m)} for m in carry["loss_multiplier"].tolist()],
        )


def check_finite_logprobs(logprobs: Sequence[torch.Tensor], version: int) -> None:
    """Stop with one line when the engine returned NaN or infinite logprobs (broken weights or engine):
    they would reach the loss (importance weights, the logprob error) silently."""
    if not logprobs or bool(torch.isfinite(torch.cat([lp.reshape(-1) for lp in logprobs])).all()):
        return  # one check over all rows; the per-row search below runs only when something is wrong
    bad = [i for i, lp in enumerate(logprobs) if not bool(torch.isfinite(lp).all())]
    if bad:
        raise WorkerFailed(
            f"generator: non-finite logprobs in {len(bad)} of {len(logprobs)} samples (first: row {bad[0]}, weight "
            f"version {version}); the generator's weights or engine are broken (a failed refit, an overflow at "
            "policy.precision); the run stops")


@dataclass
class Generated:
    """A rollout between :meth:`RolloutWorker.generate` and :meth:`RolloutWorker.score`."""

    datums: list[DatumSpec]
    rows: list[DatumSpec]
    group_size: int
    version: int
    turns: Turns
    heldout: bool = False  # validation prompts: scored by env.val_task_to_env's environments

    @property
    def needs_scoring(self) -> bool:
        """Whether an environment step is left (not when every sample ended before the last turn)."""
        return bool(self.turns.active)
