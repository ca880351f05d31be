"""Config reading is bounded: a file too big, nested too deep, a "billion laughs" of anchors and aliases, a
`defaults:` chain too long, `${...}` that multiply, are each one :class:`ConfigError` line naming the input and
the limit, in bounded memory (tracemalloc's peak, not a timing); real configs, anchors included, still load."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

import rlplane
from rlplane.config import yaml_limits as L
from rlplane.config.loading import load_config
from rlplane.config.yaml_tree import list_presets
from rlplane.errors import ConfigError

NEMO = Path(__file__).resolve().parents[2] / "fixtures" / "nemo"
PEAK_MB = 64  # far below what any of these would take unbounded (GBs)


def laughs(levels: int = 9, width: int = 9, nemo: bool = False) -> str:
    """The classic: each anchor a list of ``width`` aliases of the one before; ``width**levels`` values in all."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    lines.append(f"policy: {{model_name: *a{levels - 1}}}")
    if nemo:
        lines.append("grpo: {normalize_rewards: true}")  # a NeMo-only key: read as NeMo RL's format
    return "\n".join(lines) + "\n"


def refused(tmp_path: Path, text: str | None = None, name: str = "c.yaml", overrides=(), config=None) -> str:
    """The one line ``load_config`` raises, checked to stay within PEAK_MB."""
    if text is not None:
        (tmp_path / name).write_text(text)
        config = str(tmp_path / name)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as e:
            if isinstance(config, dict):
                rlplane.load_config(config, list(overrides))
            else:
                load_config(config, list(overrides))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_MB * 2**20, f"peak {peak / 2**20:.0f} MB"
    (line,) = str(e.value).splitlines()
    return line


@pytest.mark.parametrize("nemo", [False, True], ids=["rlplane", "nemo"])
def test_the_billion_laughs_is_refused_in_one_line(tmp_path, nemo):
    line = refused(tmp_path, laughs(nemo=nemo))
    assert line.startswith(f"config {tmp_path / 'c.yaml'}:5: the anchor &a4 here expands to more than 10,000 "
                           "values") and "MAX_CONFIG_VALUES = 10,000" in line


def test_a_wide_bomb_under_merge_keys_is_refused(tmp_path):
    base = "b0: &b0 {" + ", ".join(f"k{i}: {i}" for i in range(50)) + "}\n"
    base += "".join(f"b{i}: &b{i} {{" + ", ".join(f"x{j}: *b{i - 1}" for j in range(50)) + "}\n" for i in (1, 2, 3))
    line = refused(tmp_path, base + "policy:\n  <<: *b3\n")
    assert "MAX_CONFIG_VALUES" in line


def test_an_alias_of_its_own_anchor_is_refused(tmp_path):
    line = refused(tmp_path, "grpo: &g {inner: *g}\n")
    assert line == f"config {tmp_path / 'c.yaml'}:1: the anchor &g holds an alias of itself (a tree with no end); " \
                   "write the values out"


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    line = refused(tmp_path, "policy: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert "nested more than 32 levels deep, over MAX_CONFIG_DEPTH = 32" in line


def test_nesting_built_by_a_chain_of_aliases_is_refused(tmp_path):
    """Each line nests one level more through the alias before it: shallow in the file, deep once expanded."""
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 200))
    assert "once its aliases are expanded" in refused(tmp_path, text)


def test_a_file_too_big_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(4 << 30)  # 4 GB, sparse: reading it would take the memory
    line = refused(tmp_path, config=str(big))
    assert line == f"config {big}: 4,294,967,296 bytes, over MAX_CONFIG_BYTES = 1,048,576; a config is a few KB " \
                   "of settings: is this the right file?"


def test_too_many_values_are_refused_while_parsing(tmp_path):
    line = refused(tmp_path, "grpo: {x: [" + ", ".join(["1"] * 30_000) + "]}\n")
    assert "more than 10,000 values, over MAX_CONFIG_VALUES" in line


def test_a_long_defaults_chain_is_refused(tmp_path):
    for i in range(40):
        (tmp_path / f"c{i}.yaml").write_text(f"defaults: c{i + 1}.yaml\n" if i < 39 else "defaults: grpo_arithmetic\n")
    line = refused(tmp_path, config=str(tmp_path / "c0.yaml"))
    assert "its `defaults` chain is longer than 16 files, over MAX_DEFAULTS_DEPTH = 16" in line


def test_nemo_defaults_that_fan_out_are_refused(tmp_path):
    """Each file names the next one ten times: 10**6 reads, unbounded."""
    for i in range(6):
        (tmp_path / f"n{i}.yaml").write_text(f"defaults: [{', '.join([f'n{i + 1}.yaml'] * 10)}]\n")
    (tmp_path / "n6.yaml").write_text("grpo: {normalize_rewards: true}\n")
    line = refused(tmp_path, config=str(tmp_path / "n0.yaml"))
    assert "read more than 64 files, over MAX_DEFAULTS_FILES = 64" in line


NEMO_HEAD = "grpo: {normalize_rewards: true}\ndata: {dataset: arithmetic}\n"


@pytest.mark.parametrize("body, expected", [
    # each key doubles the string before it: 2**40 characters at the end
    ("s0: abcdefgh\n" + "".join(f"s{i}: ${{s{i - 1}}}${{s{i - 1}}}\n" for i in range(1, 41)),
     "over MAX_INTERPOLATION_STEPS"),
    # each key a list of ten references to the one before
    ("l0: [1, 2, 3]\n" + "".join(f"l{i}: [" + ", ".join([f'"${{l{i - 1}}}"'] * 10) + "]\n" for i in range(1, 9)),
     "over MAX_INTERPOLATION_STEPS"),
    ("r0: 1\n" + "".join(f"r{i}: ${{r{i - 1}}}\n" for i in range(1, 300)), "over MAX_INTERPOLATION_DEPTH = 32"),
    ("x: ${mul:3}\n", "x: ${mul:3}: mul takes two numbers, e.g. ${mul:2,3}"),
    ("x: ${div:1,0}\n", "x: ${div:1,0}: cannot compute it (division by zero); fix the numbers"),
    ("x: ${mul:abc,9}\n", "x: ${mul:abc,9}: 'abc' is not a number"),
    ("x: ${mul:4294967296,4294967296}\n", "gives a number beyond any setting (2**64 or more)"),
    ("x: ${mul:" + "9" * 5000 + ",2}\n", "is not a number"),
])
def test_interpolations_that_multiply_or_break_are_one_line(tmp_path, body, expected):
    line = refused(tmp_path, NEMO_HEAD + body)
    assert expected in line, line


def test_an_override_cannot_smuggle_a_bomb_or_a_deep_key(tmp_path):
    bomb = "[&a [1,1,1,1,1,1,1,1,1], " + ", ".join(["[*a,*a,*a,*a,*a,*a,*a,*a,*a]"] * 400) + "]"
    assert "MAX_CONFIG_VALUES" in refused(tmp_path, overrides=[f"grpo.x={bomb}"])
    assert "over MAX_CONFIG_DEPTH = 32" in refused(tmp_path, overrides=["a" + ".a" * 5000 + "=1"])


def test_a_python_mapping_with_a_cycle_or_too_deep_is_refused(tmp_path):
    cyclic: dict = {"grpo": {}}
    cyclic["grpo"]["again"] = cyclic
    assert "contains itself" in refused(tmp_path, config=cyclic)
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    assert "over MAX_CONFIG_DEPTH" in refused(tmp_path, config=deep)


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_is_well_within_the_limits(preset):
    load_config(preset)


@pytest.mark.parametrize("path", sorted(NEMO.glob("*.yaml")), ids=lambda p: p.stem)
def test_nemo_rl_recipes_with_their_anchors_still_load(path):
    load_config(str(path), ["data.dataset=arithmetic"])


def test_sharing_a_section_by_anchor_is_still_fine(tmp_path):
    (tmp_path / "c.yaml").write_text("defaults: grpo_arithmetic\nlogger: &l {progress_bar: false}\n"
                                     "x_shared: {a: *l, b: *l}\n")
    with pytest.raises(ConfigError, match="x_shared: unknown key"):  # read whole; the schema names the stray key
        load_config(str(tmp_path / "c.yaml"))


def test_the_limits_leave_room_above_the_largest_real_config():
    """NeMo RL's largest recipe here, counted as the limits count it: at least 10x below each limit."""
    text = (NEMO / "grpo_math_1B.yaml").read_text()
    assert len(text.encode()) * 10 < L.MAX_CONFIG_BYTES
    loader = L._BoundedLoader(text, "x", True)
    loader.get_single_node()
    assert loader.values * 10 < L.MAX_CONFIG_VALUES
    assert os.path.getsize(NEMO / "grpo_math_1B.yaml") < L.MAX_CONFIG_BYTES
