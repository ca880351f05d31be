"""A multi-turn environment class for rlplane: two tries at an addition, with a hint after a miss.

Turn 1: the model answers the prompt ("12+34="). Right: reward 1, done. Wrong: the environment
replies "+" (the answer is higher) or "-" (lower) and the model answers again; right on the
second try: ``second_try_reward``. The per-sample state (tries so far) lives in the metadata the
environment returns, which the rollout hands back on the next turn.

Train: cd examples/multiturn_env && rlplane train -c config.yaml
"""

from __future__ import annotations

import torch

from rlplane.envs import Environment, EnvironmentReturn, last_assistant_content


class SecondChanceEnv(Environment):
    def __init__(self, second_try_reward: float = 0.5, max_tries: int = 2):
        self.second_try_reward, self.max_tries = second_try_reward, max_tries

    def step(self, message_logs, metadata) -> EnvironmentReturn:
        observations, new_metadata, rewards, done = [], [], [], []
        for log, meta in zip(message_logs, metadata):
            tries = meta.get("tries", 0) + 1
            guess, answer = last_assistant_content(log).strip(), int(meta["ground_truth"])
            right = guess == str(answer)
            rewards.append((1.0 if tries == 1 else self.second_try_reward) if right else 0.0)
            over = right or tries >= self.max_tries or not guess.isdigit()
            hint = "" if over else ("+" if answer > int(guess) else "-")
            observations.append({"role": "environment", "content": hint})
            new_metadata.append({**meta, "tries": tries})
            done.append(over)
        n = len(message_logs)
        return EnvironmentReturn(observations, new_metadata, [None] * n, torch.tensor(rewards, dtype=torch.float32),
                                 torch.tensor(done, dtype=torch.bool), answers=None)
