"""rlplane from Python: a reward function as a plain callable, a short GRPO run, then evaluation."""

import rlplane


def score(prompt: str, completion: str, extra: dict) -> float:
    """1 for the exact sum, 0.5 when only the last digit is right, else 0."""
    answer, guess = extra["ground_truth"], completion.strip()
    if guess == answer:
        return 1.0
    return 0.5 if guess[-1:] == answer[-1:] else 0.0


cfg = rlplane.load_config("grpo_arithmetic", overrides=["grpo.max_num_steps=30", "grpo.val_period=15"])
print("steps:", cfg.grpo.max_num_steps, "model:", cfg.policy.model_name)
summary = rlplane.train(cfg, overrides=["run_dir=runs/python-api"], reward_fns={"arithmetic": score})
print({k: summary[k] for k in ("accuracy_before", "accuracy_after", "run_dir")})
result = rlplane.evaluate(checkpoint="runs/python-api", reward_fns={"arithmetic": score}, num_problems=200)
print("evaluate:", result["accuracy"], "on", result["num_problems"], "problems")
