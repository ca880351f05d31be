"""Environment variables a user sets around a run: warnings made errors, rlplane's own switches and hooks.
(The bad-input matrix runs each through the console script in a process of its own.)"""

from __future__ import annotations

import warnings

import pytest

from rlplane.errors import ConfigError
from rlplane.fast.switches import FUSED_DECODE, check_switches
from rlplane.generation import HFGenerationBackend
from rlplane.generation.kv_cache import cache_kwarg
from rlplane.models import build_char_tokenizer, build_tiny_llama
from rlplane.utils.kill_points import KILL_VAR, check_kill_spec


def test_generation_warns_nothing_so_pythonwarnings_error_runs():
    """The KV cache went in under transformers' deprecated name: a FutureWarning on every run, and a
    traceback with PYTHONWARNINGS=error."""
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden_size=16, num_layers=1, num_heads=2).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = HFGenerationBackend(model, tok, decode="hf").generate([[1, 5, 6]], max_new_tokens=3, greedy=True,
                                                                    stop_token_ids=[])
    assert len(out.output_ids[0]) == 3


def test_the_cache_keyword_follows_the_forward():
    class New:
        def forward(self, input_ids, cache=None, use_cache=False):
            pass

    class Old:
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            pass

    assert (cache_kwarg(New()), cache_kwarg(Old())) == ("cache", "past_key_values")


@pytest.mark.parametrize("value", ["disable", "2", "of"])
def test_a_switch_that_is_neither_on_nor_off_is_one_line(monkeypatch, value):
    """RLPLANE_FAST=disable was read as on: the opposite of what was meant, silently."""
    monkeypatch.setenv(FUSED_DECODE, value)
    with pytest.raises(ConfigError) as e:
        check_switches()
    assert str(e.value) == (f"environment variable {FUSED_DECODE}={value!r}: not a switch value; use 0/false/no/off "
                            "to turn it off, 1/true/yes/on (or unset) for on")


@pytest.mark.parametrize("value", ["0", "OFF", " no ", "1", "True", "on", ""])
def test_switch_words_pass(monkeypatch, value):
    monkeypatch.setenv("RLPLANE_FAST", value)
    check_switches()


def test_a_malformed_kill_hook_is_one_line_at_start(monkeypatch):
    monkeypatch.setenv(KILL_VAR, "train")
    with pytest.raises(ConfigError, match=rf"^environment variable {KILL_VAR}='train': expected <point>:<n>"):
        check_kill_spec()
    monkeypatch.setenv(KILL_VAR, "train:3")
    assert check_kill_spec() == ("train", 3)
