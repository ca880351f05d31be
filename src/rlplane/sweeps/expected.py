"""The line ``rlplane train`` prints at its end: what healthy runs of the preset gained over seeds beside what this
run gained, so a user can tell a seed's luck from a fault. The figures come from the preset's ``expected``
section (filled from its ``rlplane sweep``); a run that changed the preset is told they may not apply."""

from __future__ import annotations

from rlplane.config.resume import flatten

# Keys that do not change what a run learns (beyond the seed the range is over): where it writes and logs, how it is
# placed and kept, and the figures themselves.
_SAME_RECIPE = ("run_dir", "logger", "checkpointing", "runtime", "data_plane", "cluster", "expected",
                "policy.threads_per_worker", "{loop}.seed", "{loop}.watchdog_s")


def changed_keys(run_tree: dict, preset_tree: dict, loop: str) -> list[str]:
    """Dotted keys where the run's resolved config differs from the preset's, but for :data:`_SAME_RECIPE`."""
    skip = tuple(k.replace("{loop}", loop) for k in _SAME_RECIPE)
    a, b = flatten(run_tree), flatten(preset_tree)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return [k for k in keys if not any(k == s or k.startswith(s + ".") for s in skip)]


def _pts(v: float) -> str:
    """Points, to the tenth where a whole number would hide which side of a range a value is on."""
    text = f"{100 * v:+.1f}"
    return text[:-2] if text.endswith(".0") else text


NO_INFORMATION = "whose rewards carry no information"  # the reward controls (permute, coin)
UNTRAINED_TEACHER = "with a teacher that learned nothing"  # distillation's control


def expected_lines(expected, gain: float | None, changed: list[str], seed_key: str,
                   control_is: str = NO_INFORMATION) -> list[str]:
    """The lines to print, or none when the preset carries no figures. ``gain``: this run's (accuracy units);
    ``control_is``: what the recipe's control is (distillation's: a teacher that learned nothing)."""
    if expected.gain_low is None:
        return []
    lo, hi = expected.gain_low, expected.gain_high
    where = f" on {expected.measured_on}" if expected.measured_on else ""
    seeds = f"{expected.seeds} seeds" if expected.seeds else "several seeds"
    control = (f"; its control, {control_is}, {_pts(expected.control_gain)}"
               if expected.control_gain is not None else "")
    lines = [f"healthy runs of {expected.preset} gain {_pts(lo)} to {_pts(hi)} points of held-out accuracy "
             f"({seeds}{where}{control})"]
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        lines.append(f"this run changed {shown}: the range is for {expected.preset} as shipped")
    if gain is None:
        return lines
    if lo <= gain <= hi:
        verdict = "within that range"
    elif gain > hi:
        verdict = "above that range (a lucky seed, or a better recipe)"
    else:
        verdict = (f"below that range: try another {seed_key}, or `rlplane sweep` for the spread on this machine; "
                   "a fault shows in the run's metrics (rlplane plot)")
    lines.append(f"this run: {_pts(gain)} points, {verdict}")
    return lines


def end_of_run_lines(cfg, before: float | None, after: float | None) -> list[str]:
    """What healthy runs of the preset gain, beside this run's gain (``before``/``after``: held-out accuracy), from
    the run's ``expected`` section; none when it carries no figures."""
    from rlplane.config.loading import load_config
    from rlplane.config.recipes import RECIPES

    exp = cfg.expected
    if exp.gain_low is None or exp.preset is None:
        return []
    loop = RECIPES[cfg.algorithm].loop
    shipped = load_config(exp.preset, []).model_dump(mode="json")
    changed = changed_keys(cfg.model_dump(mode="json"), shipped, loop)
    gain = after - before if before is not None and after is not None else None
    control_is = UNTRAINED_TEACHER if cfg.algorithm == "distillation" else NO_INFORMATION
    return expected_lines(exp, gain, changed, f"{loop}.seed", control_is)
