"""Atomic checkpoints with best-K retention.

A checkpoint is written into ``tmp_step_N/`` and renamed to ``step_N/`` only once complete, so a
run killed mid-write leaves a ``tmp_*`` directory that is ignored (and removed) on resume; the
latest ``step_N`` is always whole. ``training_info.json`` holds the loop state and the ranking
metric. Retention keeps the best ``keep_top_k`` by that metric plus the latest.

Layout of ``step_N/``::

    training_info.json   step, consumed prompts, metric values
    config.yaml          the resolved config of the run
    policy/weights/      HF safetensors + tokenizer (AutoModelForCausalLM.from_pretrained loads it)
    policy/optimizer.pt  optimizer and scheduler state (torch.load(weights_only=True))
    dataloader.pt        dataloader position
    rng.pt               torch RNG states of the driver and the rollout sampler
    replay_buffer.pt     async GRPO only: the replay buffer's groups, the collector's loader position,
                         prompts drawn but not generated yet, and its sampler RNG
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

_STEP = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    def __init__(self, checkpoint_dir: str | os.PathLike, keep_top_k: int | None, metric_name: str, higher_is_better: bool):
        self.dir = Path(checkpoint_dir)
        self.keep_top_k = keep_top_k
        self.metric_name = metric_name
        self.higher_is_better = higher_is_better

    def steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())

    def latest(self) -> Path | None:
        steps = self.steps()
        return self.dir / f"step_{steps[-1]}" if steps else None

    def best(self) -> Path | None:
        ranked = self._ranked()
        return self.dir / f"step_{ranked[0]}" if ranked else self.latest()

    def save(self, step: int, training_info: dict, write: Callable[[Path], None]) -> Path:
        """Create ``tmp_step_N``, let ``write`` fill it, then rename it into place and prune."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f"tmp_step_{step}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write(tmp)
        with open(tmp / "training_info.json", "w") as f:
            json.dump(training_info, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        final = self.dir / f"step_{step}"
        if final.exists():
            old = self.dir / f"old_step_{step}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        self._prune()
        return final

    def load_info(self, path: Path) -> dict:
        with open(path / "training_info.json") as f:
            return json.load(f)

    def clean_partial(self) -> list[str]:
        """Remove half-written ``tmp_step_*`` / ``old_step_*`` directories; returns their names."""
        removed = []
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                if p.is_dir() and (p.name.startswith("tmp_step_") or p.name.startswith("old_step_")):
                    shutil.rmtree(p)
                    removed.append(p.name)
        return removed

    def _metric(self, step: int) -> float | None:
        info = self.load_info(self.dir / f"step_{step}")
        v = info.get("metrics", {}).get(self.metric_name)
        return None if v is None else float(v)

    def _ranked(self) -> list[int]:
        scored = [(s, m) for s in self.steps() if (m := self._metric(s)) is not None]
        sign = -1.0 if self.higher_is_better else 1.0
        # Best first; ties broken by recency (newer first).
        return [s for s, m in sorted(scored, key=lambda sm: (sign * sm[1], -sm[0]))]

    def _prune(self) -> None:
        if self.keep_top_k is None:
            return
        steps = self.steps()
        if len(steps) <= self.keep_top_k:
            return
        keep = set(self._ranked()[: self.keep_top_k]) | {steps[-1]}
        if len(keep) == 1:  # no metric recorded yet: keep the most recent K
            keep = set(steps[-self.keep_top_k :])
        for s in steps:
            if s not in keep:
                shutil.rmtree(self.dir / f"step_{s}")
