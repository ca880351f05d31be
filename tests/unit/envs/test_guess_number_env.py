"""The number-guessing game: feedback, reward on the hit, binary-search demonstration."""

from __future__ import annotations

import pytest

from rlplane.envs import create_env
from rlplane.envs.demonstrations import warmup_examples
from rlplane.envs.guess_number import GuessNumberEnv, binary_search_guesses, guess_number_datums
from rlplane.models.tiny import build_char_tokenizer


def _log(guess):
    return [{"role": "user", "content": "(0-63)"}, {"role": "assistant", "content": guess}]


def test_feedback_and_reward():
    env = create_env("guess_number", low=0, high=63)
    ret = env.step([_log("32"), _log("10"), _log("17"), _log("abc")], [{"ground_truth": "17"}] * 4)
    assert [o["content"] for o in ret.observations[:3]] == ["-", "+", "="]
    assert ret.rewards.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert ret.terminateds.tolist() == [False, False, True, True]  # a non-number ends the game
    assert [m["guesses"] for m in ret.metadata] == [1, 1, 1, 1]


@pytest.mark.parametrize("secret", [0, 1, 31, 32, 62, 63])
def test_binary_search_wins_in_at_most_seven(secret):
    g = binary_search_guesses(secret, 0, 63)
    assert g[-1] == secret and len(g) <= 7 and g[0] == 31


def test_demonstration_plays_the_game():
    tok = build_char_tokenizer()
    env = GuessNumberEnv(0, 63)
    (d,) = guess_number_datums(tok, 1, seed=3)
    demo = env.demonstration(d.message_log[0]["content"], d.extra_env_info)
    # Replaying the demonstration through the env gets exactly its feedback, and the last guess wins.
    meta = d.extra_env_info
    for guess, feedback in demo:
        ret = env.step([_log(guess)], [meta])
        meta = ret.metadata[0]
        assert (ret.observations[0]["content"] if feedback is not None else "=") == (feedback or "=")
    assert ret.rewards.tolist() == [1.0]
    assert len(warmup_examples(d, tok, env)) == len(demo)


def test_bad_range():
    with pytest.raises(ValueError, match="low = 9 > high = 3"):
        GuessNumberEnv(9, 3)
