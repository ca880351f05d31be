"""``task_name: sliding_puzzle_game``: NeMo RL's sliding-puzzle game (``environments/games/sliding_puzzle.py``,
``examples/run_grpo_sliding_puzzle.py``), multi-turn.

A board of ``size`` x ``size`` tiles, 1 .. size² - 1 in reading order and the gap (0) bottom right, shuffled by
random gap moves. Each turn the model ends its message with ``<action>A</action>``: ``up``/``down``/``left``/
``right`` slides the tile below/above/right of/left of the gap into it, ``slide R C`` slides the tile at row R,
column C (from 1; it must touch the gap), ``view`` shows the board. The environment answers with what happened;
the solved board scores 1.0 and ends the game, as do ``max_moves`` moves (unrewarded). A message without an
action tag ends the game unrewarded (NeMo RL clears the sample's state there and cannot go on either).

Puzzles are drawn as NeMo RL draws them: a size from 2 to ``size``, an odd number of shuffle moves from 1 to
``shuffle_moves``; here each puzzle depends only on ``(seed, index)``, so a run replays.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlplane.data.datum import DatumSpec, Message, PromptFormat, make_prompt_datum
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content

TASK_NAME = "sliding_puzzle_game"
STOP = "</action>"
_DIRECTIONS = {"up": (1, 0), "down": (-1, 0), "left": (0, 1), "right": (0, -1)}  # where the sliding tile is


def new_board(size: int, shuffle_moves: int, rng: np.random.Generator) -> dict[str, Any]:
    """A solved board shuffled by ``shuffle_moves`` random moves of the gap."""
    solution = [[r * size + c + 1 for c in range(size)] for r in range(size)]
    solution[size - 1][size - 1] = 0
    grid, (r, c) = [row[:] for row in solution], (size - 1, size - 1)
    for _ in range(shuffle_moves):
        moves = [(r + dr, c + dc) for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0))
                 if 0 <= r + dr < size and 0 <= c + dc < size]
        nr, nc = moves[int(rng.integers(len(moves)))]
        grid[r][c], grid[nr][nc] = grid[nr][nc], grid[r][c]
        r, c = nr, nc
    return {"size": size, "grid": grid, "solution": solution, "empty_pos": [r, c]}


def render(board: dict[str, Any]) -> str:
    """The board with row numbers down the left and column numbers below, the gap blank."""
    size, width = board["size"], len(str(board["size"] ** 2 - 1))
    edge = "  +" + "-" * (width + 2) * size + "+"
    rows = [f"{i + 1} |" + "".join(" " * (width + 2) if v == 0 else f" {v:>{width}} " for v in row) + "|"
            for i, row in enumerate(board["grid"])]
    labels = "    " + "".join(f"{i + 1:^{width + 2}}" for i in range(size))
    return "\n".join(["\n", edge, *rows, edge, labels])


def move(board: dict[str, Any], action: str) -> tuple[str, dict[str, Any], bool]:
    """``(what the environment says, the board after, whether a tile moved)`` for one action."""
    size, (er, ec) = board["size"], board["empty_pos"]
    if action.startswith("slide "):
        try:
            _, r, c = action.split()
            r, c = int(r) - 1, int(c) - 1
        except ValueError:
            return "Invalid input format. Use: slide row col", board, False
        if not (0 <= r < size and 0 <= c < size):
            return f"Invalid position. Row/column must be between 1 and {size}.", board, False
        if abs(r - er) + abs(c - ec) != 1:
            return "Tile must be adjacent to the empty space.", board, False
        said = "Slid tile {tile} into the empty space."
    elif action in _DIRECTIONS:
        dr, dc = _DIRECTIONS[action]
        r, c = er + dr, ec + dc
        if not (0 <= r < size and 0 <= c < size):
            return f"Cannot slide {action}.", board, False
        said = "Slid tile {tile} " + action + "."
    else:
        return "Unknown command. Type 'help' to see available commands.", board, False
    after = copy.deepcopy(board)
    tile = board["grid"][r][c]
    after["grid"][er][ec], after["grid"][r][c], after["empty_pos"] = tile, 0, [r, c]
    return said.format(tile=tile), after, True


def parse_action(text: str) -> str | None:
    """The text between the last ``<action>`` and the ``</action>`` after it (case-insensitive tags), or None."""
    low = text.lower()
    start = low.rfind("<action>")
    end = low.find(STOP, start + len("<action>")) if start != -1 else -1
    return text[start + len("<action>"):end].strip() if end != -1 else None


class SlidingPuzzleEnv(Environment):
    """The game of the module docstring; the board lives in each sample's metadata (``board``, ``moves``)."""

    def __init__(self, size: int = 3, shuffle_moves: int = 10, max_moves: int = 30):
        del size, shuffle_moves  # the dataset draws the boards; env.sliding_puzzle_game holds all three
        self.max_moves = max_moves

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"SlidingPuzzleEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        observations, rewards, done, answers, new_meta = [], [], [], [], []
        for log, meta in zip(message_logs, metadata):
            board, moves = meta["board"], int(meta.get("moves", 0))
            action = parse_action(last_assistant_content(log).strip())
            answers.append(action)
            reward, over = 0.0, False
            if moves >= self.max_moves:
                said, over = f"<error>Maximum moves ({self.max_moves}) reached.</error>", True
            elif action is None:
                said = (f"<environment>\n{render(board)}\n\nInvalid response format no move made. Try "
                        "<action></action> like this: <action>your_action</action></environment>")
                over = True
            elif action == "view":
                said = f"<environment>\n{render(board)}\n\nViewing the board. No move made.</environment>"
            else:
                text, board, moved = move(board, action)
                moves += 1
                if moved and board["grid"] == board["solution"]:
                    text, reward, over = "Congratulations! You've solved the puzzle!", 1.0, True
                said = f"<environment>\n{text}\n</environment>"
            observations.append({"role": "environment", "content": said + "\n"})
            rewards.append(reward)
            done.append(over)
            new_meta.append({**meta, "board": board, "moves": moves})
        return EnvironmentReturn(
            observations=observations,
            metadata=new_meta,
            next_stop_strings=[[STOP]] * len(observations),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.tensor(done, dtype=torch.bool),
            answers=answers,
        )


def puzzle_prompt(board: dict[str, Any]) -> str:
    """NeMo RL's opening message: the rules, the board, the goal and the action format."""
    size = board["size"]
    return (
        f"\n===== SLIDING PUZZLE =====\nArrange the {size}x{size} grid by sliding tiles into the empty space.\n"
        f"- The goal is to arrange numbers from 1 to {size * size - 1} in order\n"
        "- Use 'up', 'down', 'left', 'right' to slide in that direction\n- Use 'view' to see the current state of "
        f"the board\n\nCurrent Board State:\n{render(board)}\n\nReach the goal state where numbers are ordered 1 "
        f"through {size * size - 1} with the empty space (0) at the bottom right.\nValid actions: 'up', 'down', "
        "'left', 'right', or 'slide row col' (e.g., 'slide 1 2').\nAfter thinking, output your chosen action on a "
        "new line starting with '<action></action>' like this:\n<action>your_action</action>\nIf you just want to "
        "see the board, output <action>view</action>\nThink carefully step-by-step before acting.\n"
    )


class SlidingPuzzleDataset:
    """``num_games`` puzzles, item ``i`` depending only on ``(seed, i)`` (a map-style dataset)."""

    def __init__(self, tokenizer, num_games: int, *, size: int = 3, shuffle_moves: int = 10, max_moves: int = 30,
                 seed: int = 0, prompt_format: PromptFormat = PromptFormat()):
        self.tokenizer, self.num_games, self.seed, self.prompt_format = tokenizer, num_games, seed, prompt_format
        self.size, self.shuffle_moves, self.max_moves = size, shuffle_moves, max_moves

    def __len__(self) -> int:
        return self.num_games

    def __getitem__(self, idx: int) -> DatumSpec:
        if not 0 <= idx < self.num_games:
            raise IndexError(idx)
        rng = np.random.default_rng([self.seed % 2**63, idx])
        size = int(rng.integers(2, max(2, self.size) + 1))
        shuffles = int(rng.integers(1, max(1, self.shuffle_moves) + 1))
        board = new_board(size, shuffles + 1 - shuffles % 2, rng)  # an odd count, as NeMo RL draws it
        datum = make_prompt_datum(puzzle_prompt(board), "", self.tokenizer, idx=idx, task_name=TASK_NAME,
                                  prompt_format=self.prompt_format, extra_env_info={"board": board, "moves": 0})
        datum.stop_strings = [STOP]
        return datum
