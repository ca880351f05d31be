"""NeMo RL's environments as its configs name them: ``math_multi_reward`` (GDPO's three-part math reward) and
``sliding_puzzle_game`` (the multi-turn sliding puzzle), checked on hand-made responses."""

from __future__ import annotations

import numpy as np
import pytest

from rlplane.envs.math_multi_reward import MathMultiRewardEnv, multi_reward, xml_answer
from rlplane.envs.sliding_puzzle import SlidingPuzzleEnv, move, new_board, parse_action, render


def log(text: str) -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


@pytest.mark.parametrize("response, parts", [
    ("<think>2+2</think>\n<answer>4</answer>", {"correctness": 1.0, "integer": 1.0, "format": 1.0}),
    ("<think>2+2</think>\n<answer>5</answer>", {"correctness": 0.0, "integer": 1.0, "format": 1.0}),
    ("<answer>4</answer>", {"correctness": 1.0, "integer": 1.0, "format": 0.0}),  # no think block
    ("4", {"correctness": 1.0, "integer": 1.0, "format": 0.0}),  # no tags: the whole response is the answer
    ("<think>x</think>\n<answer>four</answer>", {"correctness": 0.0, "integer": 0.0, "format": 1.0}),
    ("<think>x</think>\n<answer>4</answer><answer>4</answer>", {"correctness": 1.0, "integer": 1.0,
                                                                "format": 0.0}),  # two answer tags
])
def test_math_multi_reward_components(response, parts):
    assert multi_reward(response, "4") == parts


def test_math_multi_reward_env_sums_its_components():
    env = MathMultiRewardEnv()
    out = env.step([log("<think>a</think>\n<answer>4</answer>"), log("<answer>x</answer>")],
                   [{"ground_truth": "4"}, {"ground_truth": "4"}])
    assert out.rewards.tolist() == [3.0, 0.0]  # 1 + 1 + 1; 0 + 0 + 0
    assert out.reward_components["integer"].tolist() == [1.0, 0.0]
    assert out.answers == ["4", "x"] and xml_answer("a<answer> 7 </answer>b") == "7"


def test_board_moves_and_rendering():
    board = {"size": 2, "grid": [[1, 2], [0, 3]], "solution": [[1, 2], [3, 0]], "empty_pos": [1, 0]}
    said, after, moved = move(board, "left")  # the tile right of the gap (3) slides left: solved
    assert moved and said == "Slid tile 3 left." and after["grid"] == [[1, 2], [3, 0]] and after["empty_pos"] == [1, 1]
    assert move(board, "right")[0] == "Cannot slide right."  # no tile left of the gap
    assert move(board, "slide 2 2")[1]["grid"] == [[1, 2], [3, 0]]  # the same move by position
    assert move(board, "slide 1 2")[0] == "Tile must be adjacent to the empty space."
    assert move(board, "jump")[0].startswith("Unknown command")
    # Cells 3 wide (" 1 ", the gap "   "): "1 |" + " 1 " + " 2 " + "|"; the edge is "-" * 3 * 2 between "+"s.
    assert render(board).splitlines()[2:6] == ["  +------+", "1 | 1  2 |", "2 |    3 |", "  +------+"]
    assert parse_action("think... <ACTION> up </action> trailing") == "up" and parse_action("no tags") is None


def test_a_shuffled_board_is_solvable_by_undoing_it():
    rng = np.random.default_rng(0)
    board = new_board(3, 7, rng)
    flat = sorted(v for row in board["grid"] for v in row)
    assert flat == list(range(9)) and board["grid"][board["empty_pos"][0]][board["empty_pos"][1]] == 0


def test_sliding_puzzle_env_turns():
    env = SlidingPuzzleEnv(max_moves=2)
    board = {"size": 2, "grid": [[1, 2], [0, 3]], "solution": [[1, 2], [3, 0]], "empty_pos": [1, 0]}
    meta = [{"board": board, "moves": 0}] * 4
    out = env.step([log("<action>left</action>"), log("<action>view</action>"), log("hmm"), log("<action>up</action>")],
                   meta)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out.terminateds.tolist() == [True, False, True, False]  # solved; view; no action tag; a blocked move
    assert out.metadata[3]["moves"] == 1 and out.metadata[1]["moves"] == 0
    assert out.next_stop_strings == [["</action>"]] * 4
    over = env.step([log("<action>up</action>")], [{"board": board, "moves": 2}])
    assert over.terminateds.tolist() == [True] and "Maximum moves (2)" in over.observations[0]["content"]
