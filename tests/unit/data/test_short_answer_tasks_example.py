"""``examples/short_answer_tasks/make_tasks.py``: every answer is right, train and held-out never share a problem."""

import importlib.util
import json
import random
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "short_answer_tasks" / "make_tasks.py"


@pytest.fixture(scope="module")
def make_tasks():
    spec = importlib.util.spec_from_file_location("make_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lookup_answers_the_asked_variable(make_tasks):
    rng = random.Random(3)
    for _ in range(200):
        row = make_tasks.lookup(rng)
        pairs = dict(re.findall(r"(\w) = (\d+)", row["problem"]))
        asked = re.search(r"What is (\w)\?$", row["problem"]).group(1)
        assert 6 <= len(pairs) <= 8 and len(set(pairs.values())) == len(pairs)  # distinct values: one right answer
        assert row["answer"] == pairs[asked]


def test_largest_is_the_maximum(make_tasks):
    rng = random.Random(5)
    for _ in range(200):
        row = make_tasks.largest(rng)
        numbers = [int(x) for x in re.findall(r"\d+", row["problem"])]
        assert 6 <= len(numbers) <= 8 and len(set(numbers)) == len(numbers)
        assert row["answer"] == str(max(numbers))


def test_duplicate_is_the_one_number_seen_twice(make_tasks):
    rng = random.Random(6)
    adjacent = 0
    for _ in range(300):
        row = make_tasks.duplicate(rng)
        numbers = re.findall(r"\d+", row["problem"])
        counts = {n: numbers.count(n) for n in numbers}
        assert 6 <= len(numbers) <= 8 and sorted(counts.values())[-2:] == [1, 2]  # exactly one number twice
        assert row["answer"] == max(counts, key=counts.get)
        first = numbers.index(row["answer"])
        adjacent += numbers[first + 1] == row["answer"]
    assert 0 < adjacent < 150  # the copy lands next to its twin only sometimes (2 of 6-8 places)

    class Fixed:  # the list, the copied number and its place chosen by hand
        randint = staticmethod(lambda *_: 3)
        sample = staticmethod(lambda *_: [41, 87, 15])
        choice = staticmethod(lambda xs: xs[1])
        randrange = staticmethod(lambda *_: 0)

    assert make_tasks.duplicate(Fixed()) == {"problem": "Which number appears twice in this list: 87, 41, 87, 15?",
                                             "answer": "87"}


def test_month_counts_around_the_year(make_tasks):
    rng = random.Random(4)
    months = make_tasks.MONTHS
    for _ in range(300):
        row = make_tasks.month(rng)
        n, when, start = re.fullmatch(r"Which month comes (\d) months? (after|before) (\w+)\?", row["problem"]).groups()
        step = int(n) if when == "after" else -int(n)
        assert row["answer"] == months[(months.index(start) + step) % 12]

    class Fixed:  # start, offset and direction chosen by hand
        def __init__(self, start, n, sign):
            self.randrange, self.randint, self.choice = (lambda *_: start), (lambda *_: n), (lambda *_: sign)

    assert make_tasks.month(Fixed(1, 3, -1)) == {"problem": "Which month comes 3 months before February?",
                                                 "answer": "November"}  # Feb -> Jan, Dec, Nov
    assert make_tasks.month(Fixed(8, 6, 1))["answer"] == "March"  # Sep + 6: Oct Nov Dec Jan Feb Mar
    assert make_tasks.month(Fixed(0, 1, 1))["problem"] == "Which month comes 1 month after January?"


def test_too_many_held_out_problems_is_one_line(make_tasks, tmp_path):
    with pytest.raises(SystemExit, match="only 144 distinct problems found for --val-size 200"):
        make_tasks.write("month", tmp_path, train_size=10, val_size=200, seed=0)


@pytest.mark.parametrize("task", ["duplicate", "largest", "lookup", "month", "convert", "letter", "tens", "double",
                                  "category"])
def test_written_splits_are_disjoint_and_routed(make_tasks, tmp_path, task):
    make_tasks.write(task, tmp_path, train_size=300, val_size=40, seed=1)
    train = [json.loads(line) for line in open(tmp_path / "train.jsonl")]
    val = [json.loads(line) for line in open(tmp_path / "val.jsonl")]
    assert (len(train), len(val)) == (300, 40)
    assert not {r["problem"] for r in train} & {r["problem"] for r in val}
    assert {r["task_name"] for r in train + val} == {"short_answer"}
    make_tasks.write(task, tmp_path / "again", train_size=300, val_size=40, seed=1)
    assert (tmp_path / "again" / "val.jsonl").read_text() == (tmp_path / "val.jsonl").read_text()  # seeded


def test_convert_multiplies_by_the_units_factor(make_tasks):
    rng = random.Random(8)
    factors = {(small, big): f for big, small, f in make_tasks.UNITS}
    for _ in range(300):
        row = make_tasks.convert(rng)
        small, n, big = re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", row["problem"]).groups()
        assert 2 <= int(n) <= 50 and row["answer"] == str(int(n) * factors[small, big])
    # 7 hours: 7 x 60 = 420 minutes
    assert make_tasks.convert(type("Fixed", (), {"choice": staticmethod(lambda xs: xs[0]),
                                                  "randint": staticmethod(lambda *_: 7)})()) == {
        "problem": "How many minutes are in 7 hours?", "answer": "420"}


def test_letter_counts_along_the_alphabet_and_stays_inside_it(make_tasks):
    rng = random.Random(9)
    seen = set()
    for _ in range(2000):
        row = make_tasks.letter(rng)
        m = re.fullmatch(r"Which letter of the alphabet comes (?:right|(\d) letters) (after|before) ([A-Z])\?",
                         row["problem"])
        n, when, start = int(m.group(1) or 1), m.group(2), m.group(3)
        assert (m.group(1) is None) == (n == 1) and 1 <= n <= 5
        assert ord(row["answer"]) == ord(start) + (n if when == "after" else -n) and "A" <= row["answer"] <= "Z"
        seen.add(row["problem"])
    assert len(seen) == 230  # every start and offset within A-Z: 2 x (25 + 24 + 23 + 22 + 21)


@pytest.mark.parametrize("task,rule", [
    ("tens", lambda n: n % 10 == 0),
    ("double", lambda n: n % 11 == 0),
])
def test_exactly_one_number_of_the_asked_class_and_it_is_the_answer(make_tasks, task, rule):
    rng = random.Random(10)
    places = set()
    for _ in range(300):
        row = getattr(make_tasks, task)(rng)
        numbers = [int(x) for x in re.findall(r"\d+", row["problem"].split(":")[1])]
        assert 4 <= len(numbers) <= 6 and len(set(numbers)) == len(numbers)
        assert [n for n in numbers if rule(n)] == [int(row["answer"])]
        places.add(numbers.index(int(row["answer"])))
    assert places == set(range(6))  # the answer lands anywhere in the list


def test_category_has_one_word_of_the_category(make_tasks):
    rng = random.Random(11)
    for _ in range(300):
        row = make_tasks.category(rng)
        kind, words = re.fullmatch(r"Which of these words is (an? \w+): (.*)\?", row["problem"]).groups()
        words = words.split(", ")
        members = [w for w in words if any(w in group for group in make_tasks.CATEGORIES.values())]
        assert members == [row["answer"]] and row["answer"] in make_tasks.CATEGORIES[kind] and 4 <= len(words) <= 6
