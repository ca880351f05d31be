"""docs/config.md is the schema's own reference: regenerated here and compared, so a key added, renamed or
re-described without regenerating the page fails CI."""

from __future__ import annotations

from pathlib import Path

from rlplane.config.nemo_yaml import load_nemo_chain
from rlplane.config.reference import config_keys, reference_markdown

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "nemo"
# NeMo RL keys its GRPO config class has that none of the YAML fixtures sets.
NEMO_KEYS_NOT_IN_FIXTURES = {"grpo.skip_reference_policy_logprobs_calculation", "grpo.adv_estimator.reward_weights"}


def test_the_checked_in_page_is_the_schemas():
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == reference_markdown(), (
        "docs/config.md is out of date: python -m rlplane.config.reference > docs/config.md")


def test_every_key_has_a_default_a_range_and_a_description():
    keys = config_keys()
    assert len({k.key for k in keys}) == len(keys) > 300
    for k in keys:
        assert k.default and k.range and k.description and k.nemo, k


def _nemo_keys() -> set[str]:
    keys: set[str] = set()

    def flat(tree: dict, prefix: str = "") -> None:
        for k, v in tree.items():
            keys.add(prefix + k)
            if isinstance(v, dict):
                flat(v, f"{prefix}{k}.")

    for path in FIXTURES.glob("*.yaml"):
        flat(load_nemo_chain(path) or {})
    return keys


def test_a_key_said_to_keep_its_nemo_name_is_in_nemo_rls_files():
    nemo = _nemo_keys() | NEMO_KEYS_NOT_IN_FIXTURES
    claimed = [k.key for k in config_keys() if k.nemo == "same"]
    assert claimed and [k for k in claimed if k not in nemo] == []
