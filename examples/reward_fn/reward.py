"""A reward function for rlplane: exact answer 1.0, partial credit for each right digit.

Train: cd examples/reward_fn && rlplane train -c config.yaml   (data: make_data.py)
"""


def score(prompt: str, completion: str, extra: dict) -> float:
    """``prompt`` e.g. "12+34=", ``completion`` the model's answer, ``extra`` the row's other fields
    (``ground_truth`` = the row's answer)."""
    answer, guess = str(extra["ground_truth"]), completion.strip()
    if guess == answer:
        return 1.0
    if not guess.isdigit():
        return 0.0
    # Half credit at most: the digits in the right place, counted from the right (units first).
    right = sum(a == b for a, b in zip(reversed(guess), reversed(answer)))
    return 0.5 * right / max(len(guess), len(answer))
