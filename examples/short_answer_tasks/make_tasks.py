"""Write procedural short-answer tasks as JSONL (train and held-out, disjoint) for ``task_name: short_answer``.

    python examples/short_answer_tasks/make_tasks.py lookup --out data/lookup
    rlplane train -c grpo_smollm2_tasks data.dataset=jsonl data.train.path=data/lookup/train.jsonl \\
        data.validation.path=data/lookup/val.jsonl

Every row carries ``"task_name": "short_answer"``, so no default task name is needed.

lookup: "q = 12, d = 5, x = 27, ... What is x?" -> 27 (6-8 variables, distinct values 1-29): the answer is in
the prompt, at a uniformly drawn position, so no rule that skips the question's variable beats 1 in 6.
largest: "Which is the largest of these numbers: 41, 87, 15, 92, 60, 33?" -> 92 (6-8 distinct two-digit
numbers; the largest at a uniformly drawn position).
duplicate: "Which number appears twice in this list: 63, 15, 43, 43, 75, 72, 61?" -> 43 (5-7 distinct two-digit
numbers, one of them copied to a uniformly drawn place, next to its twin or not).
sequence: "What number comes next: 7, 11, 15, 19?" -> 23 (an arithmetic sequence, 4-5 terms, start 1-40, step
2-9): a pattern task; the answer is in no list, so no copying rule scores.
count: "How many of these numbers are greater than 50: 63, 15, 43, 75, 72?" -> 3 (5-7 distinct two-digit numbers,
each above 50 with probability 1/2): a counting task; its answers 0-7 follow a binomial, so always answering the
commonest one scores about a third.
ordinal: "In the list owl, cat, fox, bee, dog, which word is fourth?" -> bee (5-7 distinct three-letter words,
the asked position uniform): retrieval by position, not by name.
odd: "Which of these numbers is odd: 14, 28, 37, 42, 60?" -> 37 (4-6 distinct two-digit numbers, one odd, at a
uniformly drawn position): a classification task.
after: "In the list owl, cat, fox, bee, dog, which word comes right after fox?" -> bee (5-7 distinct three-letter
words, the asked word never the last): retrieval by adjacency.
reverse: "q = 12, d = 5, x = 27, ... Which letter is 27?" -> x: lookup the other way round (6-8 variables).
category: "Which of these words is a fruit: chair, bottle, peach, ladder?" -> peach (one of three categories, 3-5
household words around it): word knowledge.
tens: "Which of these numbers is a multiple of ten: 69, 16, 80, 83?" -> 80 (4-6 two-digit numbers, one a multiple of
ten, at a uniformly drawn place): classification by the last digit.
double: "Which of these numbers has two equal digits: 69, 16, 88, 82?" -> 88 (as tens, the one of 11, 22, ..., 99).
convert: "How many minutes are in 7 hours?" -> 420 (one of 8 unit pairs, 2-50 of the larger unit): a known
factor times a number.
letter: "Which letter of the alphabet comes 2 letters before K?" -> I (1-5 letters either way, within A-Z: 230
problems, so the held-out set is a share of them).
month: "Which month comes 3 months before February?" -> November (1-6 months either way: 144 problems, so
the held-out set is a share of them: --val-size 60 leaves 84 to train on).
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

NAMES = [c for c in string.ascii_lowercase if c not in "il"]  # l and i read like 1


def lookup(rng: random.Random, min_vars: int = 6, max_vars: int = 8) -> dict:
    k = rng.randint(min_vars, max_vars)
    names, values = rng.sample(NAMES, k), rng.sample(range(1, 30), k)
    q = rng.randrange(k)
    text = ", ".join(f"{n} = {v}" for n, v in zip(names, values))
    return {"problem": f"{text}. What is {names[q]}?", "answer": str(values[q])}


MONTHS = ("January February March April May June July August September October November December").split()


def month(rng: random.Random, max_offset: int = 6) -> dict:
    start, n, sign = rng.randrange(12), rng.randint(1, max_offset), rng.choice((1, -1))
    when = "after" if sign > 0 else "before"
    unit = "month" if n == 1 else "months"
    answer = MONTHS[(start + sign * n) % 12]
    return {"problem": f"Which month comes {n} {unit} {when} {MONTHS[start]}?", "answer": answer}


def largest(rng: random.Random, min_count: int = 6, max_count: int = 8) -> dict:
    numbers = rng.sample(range(10, 100), rng.randint(min_count, max_count))
    return {"problem": f"Which is the largest of these numbers: {', '.join(map(str, numbers))}?",
            "answer": str(max(numbers))}


def duplicate(rng: random.Random, min_count: int = 5, max_count: int = 7) -> dict:
    numbers = rng.sample(range(10, 100), rng.randint(min_count, max_count))
    twice = rng.choice(numbers)
    numbers.insert(rng.randrange(len(numbers) + 1), twice)
    return {"problem": f"Which number appears twice in this list: {', '.join(map(str, numbers))}?",
            "answer": str(twice)}


def sequence(rng: random.Random, min_terms: int = 4, max_terms: int = 5) -> dict:
    start, step, n = rng.randint(1, 40), rng.randint(2, 9), rng.randint(min_terms, max_terms)
    terms = [start + i * step for i in range(n)]
    return {"problem": f"What number comes next: {', '.join(map(str, terms))}?", "answer": str(start + n * step)}


def count(rng: random.Random, min_count: int = 5, max_count: int = 7) -> dict:
    k = rng.randint(min_count, max_count)
    numbers = [rng.choice(range(51, 100)) if rng.random() < 0.5 else rng.choice(range(10, 50)) for _ in range(k)]
    while len(set(numbers)) < k:  # distinct, each side kept
        i = rng.randrange(k)
        numbers[i] = rng.choice(range(51, 100)) if numbers[i] > 50 else rng.choice(range(10, 50))
    above = sum(n > 50 for n in numbers)
    return {"problem": f"How many of these numbers are greater than 50: {', '.join(map(str, numbers))}?",
            "answer": str(above)}


WORDS = ("ant bat bee cat cow dog eel elk emu fox gnu hen jay owl pig ram rat yak ape hog").split()
ORDINALS = ("first second third fourth fifth sixth seventh").split()


def ordinal(rng: random.Random, min_count: int = 5, max_count: int = 7) -> dict:
    words = rng.sample(WORDS, rng.randint(min_count, max_count))
    q = rng.randrange(len(words))
    return {"problem": f"In the list {', '.join(words)}, which word is {ORDINALS[q]}?", "answer": words[q]}


def odd(rng: random.Random, min_count: int = 4, max_count: int = 6) -> dict:
    k = rng.randint(min_count, max_count)
    numbers = rng.sample(range(10, 100, 2), k - 1)
    numbers.insert(rng.randrange(k), rng.randrange(11, 100, 2))
    return {"problem": f"Which of these numbers is odd: {', '.join(map(str, numbers))}?",
            "answer": str(next(n for n in numbers if n % 2))}


def after(rng: random.Random, min_count: int = 5, max_count: int = 7) -> dict:
    words = rng.sample(WORDS, rng.randint(min_count, max_count))
    q = rng.randrange(len(words) - 1)
    return {"problem": f"In the list {', '.join(words)}, which word comes right after {words[q]}?",
            "answer": words[q + 1]}


def reverse(rng: random.Random, min_vars: int = 6, max_vars: int = 8) -> dict:
    k = rng.randint(min_vars, max_vars)
    names, values = rng.sample(NAMES, k), rng.sample(range(1, 30), k)
    q = rng.randrange(k)
    text = ", ".join(f"{n} = {v}" for n, v in zip(names, values))
    return {"problem": f"{text}. Which letter is {values[q]}?", "answer": names[q]}


CATEGORIES = {
    "an animal": "horse sheep tiger mouse rabbit zebra monkey donkey camel whale".split(),
    "a color": "red blue green yellow purple orange black white brown pink".split(),
    "a fruit": "apple banana cherry grape lemon mango peach pear plum melon".split(),
}
THINGS = "chair table spoon window bottle pencil carpet bucket ladder hammer candle basket pillow mirror".split()


def category(rng: random.Random, min_count: int = 4, max_count: int = 6) -> dict:
    kind = rng.choice(sorted(CATEGORIES))
    words = rng.sample(THINGS, rng.randint(min_count, max_count) - 1)
    answer = rng.choice(CATEGORIES[kind])
    words.insert(rng.randrange(len(words) + 1), answer)
    return {"problem": f"Which of these words is {kind}: {', '.join(words)}?", "answer": answer}


def _one_of_a_class(rng, others: list[int], draw_answer, question: str, min_count: int, max_count: int) -> dict:
    """``question`` over k-1 numbers drawn from ``others`` (k from min to max) and ``draw_answer(rng)`` at a uniformly
    drawn place."""
    k = rng.randint(min_count, max_count)
    numbers = rng.sample(others, k - 1)
    answer = draw_answer(rng)
    numbers.insert(rng.randrange(k), answer)
    return {"problem": f"{question}: {', '.join(map(str, numbers))}?", "answer": str(answer)}


def tens(rng: random.Random, min_count: int = 4, max_count: int = 6) -> dict:
    return _one_of_a_class(rng, [n for n in range(11, 100) if n % 10], lambda r: r.randrange(10, 100, 10),
                           "Which of these numbers is a multiple of ten", min_count, max_count)


def double(rng: random.Random, min_count: int = 4, max_count: int = 6) -> dict:
    return _one_of_a_class(rng, [n for n in range(10, 100) if n % 11], lambda r: 11 * r.randint(1, 9),
                           "Which of these numbers has two equal digits", min_count, max_count)


UNITS = (("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
         ("meters", "centimeters", 100), ("kilograms", "grams", 1000), ("dozens", "items", 12),
         ("centuries", "years", 100))


def convert(rng: random.Random, max_count: int = 50) -> dict:
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, max_count)
    return {"problem": f"How many {small} are in {n} {big}?", "answer": str(n * factor)}


LETTERS = string.ascii_uppercase


def letter(rng: random.Random, max_offset: int = 5) -> dict:
    n, sign = rng.randint(1, max_offset), rng.choice((1, -1))
    start = rng.randrange(n, len(LETTERS)) if sign < 0 else rng.randrange(len(LETTERS) - n)
    when = "after" if sign > 0 else "before"
    what = f"right {when}" if n == 1 else f"{n} letters {when}"
    return {"problem": f"Which letter of the alphabet comes {what} {LETTERS[start]}?",
            "answer": LETTERS[start + sign * n]}


TASKS = {
    "after": after,
    "category": category,
    "convert": convert,
    "count": count,
    "double": double,
    "duplicate": duplicate,
    "largest": largest,
    "letter": letter,
    "lookup": lookup,
    "month": month,
    "odd": odd,
    "ordinal": ordinal,
    "reverse": reverse,
    "sequence": sequence,
    "tens": tens,
}


def write(task: str, out: Path, train_size: int, val_size: int, seed: int) -> None:
    rng, make = random.Random(seed), TASKS[task]
    val: dict[str, dict] = {}
    for _ in range(100 * val_size):  # held-out problems are distinct; training rows may repeat one
        if len(val) == val_size:
            break
        row = make(rng)
        val[row["problem"]] = row
    else:
        raise SystemExit(f"{task}: only {len(val)} distinct problems found for --val-size {val_size}; ask for fewer")
    train: list[dict] = []
    while len(train) < train_size:
        row = make(rng)
        if row["problem"] not in val:
            train.append(row)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", list(val.values()))):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps({**r, "task_name": "short_answer"}) + "\n" for r in rows)
    print(f"{out}/train.jsonl: {len(train)} problems; {out}/val.jsonl: {len(val)} held out")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--val-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    write(a.task, a.out, a.train_size, a.val_size, a.seed)
