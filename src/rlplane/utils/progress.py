"""Progress on stderr: a tqdm bar on a terminal, else one line per ``logger.log_every_n_steps`` steps
(a redrawn bar captured to a file would grow it by every frame). Both carry the step's learning
diagnostics (:data:`DIAGNOSTICS`)."""

from __future__ import annotations

import sys
import time

# (short label, metric key): the compact diagnostics of each step, where logged.
DIAGNOSTICS = (("ent", "train/approx_entropy"), ("clip", "train/clip_fraction"), ("kl", "train/kl_penalty"),
               ("len", "train/mean_gen_tokens_per_sample"), ("rstd", "train/reward_std_in_group"),
               ("eq", "train/equal_reward_groups"))


def diagnostics(metrics: dict) -> dict[str, float]:
    """``{label: value}`` of the :data:`DIAGNOSTICS` that ``metrics`` holds."""
    return {label: float(metrics[key]) for label, key in DIAGNOSTICS if isinstance(metrics.get(key), (int, float))}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    def __init__(self, total: int, desc: str, every: int, *, enabled: bool = True, bar: bool = True, stream=None):
        self.total, self.desc, self.every, self.enabled = total, desc, every, enabled
        self.stream = stream or sys.stderr
        self.use_bar = bar and self.stream.isatty()
        self._bar = None
        self._t0 = self._step0 = None

    def figures(self, metrics: dict) -> dict[str, float]:
        post = {"reward": metrics.get("train/reward")}
        if "validation/accuracy" in metrics:
            post["val_acc"] = metrics["validation/accuracy"]
            # A collapse onto one answer: val_top near 1 and val_acc near what that constant answer scores.
            post["val_top"] = metrics.get("validation/top_answer_share")
            post["val_const"] = metrics.get("validation/constant_answer_accuracy")
        return {k: v for k, v in post.items() if v is not None}

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled or step <= 0:
            return
        now = time.perf_counter()
        if self._t0 is None:  # the first logged step: speed is measured from here (resume-safe)
            self._t0, self._step0 = now, step - 1
        post = self.figures(metrics)
        if self.use_bar:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(total=self.total, initial=step - 1, desc=self.desc, file=self.stream,
                                 dynamic_ncols=True)
            self._bar.n = step
            self._bar.set_postfix({**{k: f"{v:.3f}" for k, v in post.items()},
                                   **{k: f"{v:.3g}" for k, v in diagnostics(metrics).items()}}, refresh=True)
            return
        if step % self.every and step != self.total and "val_acc" not in post:
            return
        done = step - self._step0
        per_step = (now - self._t0) / max(done, 1)
        diag = " ".join(f"{k} {v:.3g}" for k, v in diagnostics(metrics).items())
        parts = [f"{self.desc} step {step}/{self.total}", *(f"{k} {v:.3f}" for k, v in post.items()),
                 *([diag] if diag else []), f"{per_step:.2f} s/step", f"elapsed {_duration(now - self._t0)}",
                 f"eta {_duration(per_step * (self.total - step))}"]
        print(" | ".join(parts), file=self.stream, flush=True)

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg, file=self.stream)
        else:
            print(msg, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
