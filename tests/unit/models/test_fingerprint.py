"""The weight fingerprint: equal for equal weights, and a difference named for every kind of wrong tensor."""

from __future__ import annotations

import dataclasses

import torch

from rlplane.models.fingerprint import SAMPLES, SUM_RTOL, Fingerprint, difference, fingerprint


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(64, 64, generator=g), "b.weight": torch.randn(64, 64, generator=g),
            "c.bias": torch.randn(64, generator=g), "ids": torch.arange(5)}


def test_equal_weights_have_equal_fingerprints():
    w = weights()
    a, b = fingerprint(w), fingerprint({k: v.clone() for k, v in w.items()})
    assert difference(a, b) is None and a.digest == b.digest and len(a.digest) == 8


def test_names_restrict_the_fingerprint_and_a_missing_name_shows_as_missing():
    w = weights()
    sub = fingerprint(w, ["a.weight", "c.bias"])
    assert [n for n, _ in sub.tensors] == ["a.weight", "c.bias"]
    assert difference(fingerprint(w), fingerprint(w, ["a.weight", "b.weight", "c.bias"])) == \
        "1 tensors missing (ids, ...)"
    assert difference(sub, fingerprint(w)).startswith("2 tensors not sent")


def test_swapped_transposed_reshaped_and_noised_tensors_differ():
    w, sent = weights(), fingerprint(weights())
    cases = {
        "swapped": {**w, "a.weight": w["b.weight"], "b.weight": w["a.weight"]},
        "transposed": {**w, "a.weight": w["a.weight"].t().contiguous()},
        "noised": {**w, "b.weight": w["b.weight"] + 1e-6 * torch.randn(64, 64)},
        "scaled": {**w, "c.bias": w["c.bias"] * 1.0001},
    }
    for name, case in cases.items():
        assert difference(sent, fingerprint(case)) is not None, name
    reshaped = {**w, "a.weight": w["a.weight"].reshape(32, 128)}
    assert difference(sent, fingerprint(reshaped)) == "a.weight has shape [32, 128], sent [64, 64]"


def test_one_changed_element_is_found_by_the_sample_or_by_the_sum():
    w = weights()
    sent = fingerprint(w)
    sampled = (torch.arange(SAMPLES) * 2_654_435_761 % 4096).tolist()
    unsampled = next(i for i in range(4096) if i not in set(sampled))
    tiny = w["a.weight"].clone()
    tiny.view(-1)[sampled[3]] += 1e-6  # far below the sum's tolerance: the sample's hash sees it
    assert difference(sent, fingerprint({**w, "a.weight": tiny})) == "a.weight differs (sampled values)"
    big = w["a.weight"].clone()
    big.view(-1)[unsampled] += 1.0  # not sampled: the sum moves past its tolerance
    assert difference(sent, fingerprint({**w, "a.weight": big})).startswith("a.weight differs (sum")


def test_sums_agree_within_the_tolerance_of_another_reduction_order():
    sent = fingerprint(weights())
    name, t = sent.tensors[0]
    nudged = dataclasses.replace(t, total=t.total + 0.5 * SUM_RTOL * t.mass)  # float32 rounding of another order
    assert difference(sent, Fingerprint(((name, nudged), *sent.tensors[1:]))) is None
    off = dataclasses.replace(t, total=t.total + 2 * SUM_RTOL * t.mass)
    assert difference(sent, Fingerprint(((name, off), *sent.tensors[1:]))) is not None


def test_values_compare_as_float32_on_any_device_and_dtype():
    w = weights()
    as_double = {k: v.double() if v.is_floating_point() else v for k, v in w.items()}
    assert difference(fingerprint(w), fingerprint(as_double)) is None  # the same float32 values
    as_bf16 = {k: v.bfloat16() if v.is_floating_point() else v for k, v in w.items()}
    assert difference(fingerprint(w), fingerprint(as_bf16)) is not None  # rounded: not what was sent
