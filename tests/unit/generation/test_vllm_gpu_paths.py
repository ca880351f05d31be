"""The vllm backend's GPU paths on CPU, without vllm: the device checks, what a refit hands
``load_weights`` (no host copy when the engine's model is in this process), and the sleep/wake order
around a refit and a generation, against a fake engine that records its calls.

The fake stands in for ``vllm.LLM`` (its ``sleep``/``wake_up``/``apply_model``/``reset_prefix_cache``);
these paths have not run on a real GPU engine. ``meta`` tensors stand in for tensors on a GPU: they
have a non-CPU device and no data, so a host copy of one would fail (``Cannot copy out of meta tensor``).
"""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.generation.vllm_backend import EngineHandle, check_engine_devices, refit_items


class FakeModel:
    def __init__(self):
        self.loaded: list[list[tuple[str, torch.Tensor]]] = []

    def load_weights(self, items):
        self.loaded.append(list(items))

    def modules(self):
        return []


class FakeLLM:
    """Records the engine calls in order; ``apply_model`` runs the function on a fake model as vLLM's
    in-process engine does."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.model = FakeModel()

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def apply_model(self, fn):
        self.calls.append(("apply_model",))
        return fn(self.model)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


# ---- device checks -------------------------------------------------------------------------------
def test_tensor_parallel_beyond_the_visible_gpus_is_one_line():
    with pytest.raises(ConfigError) as e:
        check_engine_devices(tensor_parallel_size=4, enable_sleep_mode=False, visible_gpus=2, sleep_mode_available=True)
    msg = str(e.value)
    assert "\n" not in msg and "tensor_parallel_size = 4" in msg and "sees 2 GPU(s)" in msg and "to 2" in msg


def test_tensor_parallel_without_a_gpu_is_one_line():
    with pytest.raises(ConfigError, match="sees no GPU"):
        check_engine_devices(tensor_parallel_size=2, enable_sleep_mode=False, visible_gpus=0,
                             sleep_mode_available=False)


def test_sleep_mode_where_vllm_has_none_is_one_line():
    with pytest.raises(ConfigError, match="enable_sleep_mode = true: this vLLM build has no sleep mode"):
        check_engine_devices(tensor_parallel_size=1, enable_sleep_mode=True, visible_gpus=0, sleep_mode_available=False)


def test_fitting_settings_pass():
    check_engine_devices(tensor_parallel_size=1, enable_sleep_mode=False, visible_gpus=0, sleep_mode_available=False)
    check_engine_devices(tensor_parallel_size=2, enable_sleep_mode=True, visible_gpus=2, sleep_mode_available=True)


# ---- what a refit hands the engine ----------------------------------------------------------------
def test_in_process_refit_hands_over_device_tensors_without_a_copy():
    on_gpu = {"model.w": torch.empty(3, 2, device="meta"), "lm_head.weight": torch.empty(5, 2, device="meta")}
    items = refit_items(on_gpu, tied=False, engine_in_process=True)
    assert [n for n, _ in items] == ["model.w", "lm_head.weight"]
    assert all(t is on_gpu[n] for n, t in items)  # the very tensors: no host round trip, no copy


def test_tied_head_is_not_handed_over():
    sd = {"model.embed_tokens.weight": torch.zeros(2, 2), "lm_head.weight": torch.zeros(2, 2)}
    assert [n for n, _ in refit_items(sd, tied=True, engine_in_process=True)] == ["model.embed_tokens.weight"]


def test_tensor_parallel_refit_sends_host_tensors():
    # Engine ranks in other processes: a device tensor must become a host tensor (the meta stand-in
    # cannot, so the conversion is visible as an error); host tensors go as they are.
    host = torch.ones(2)
    assert refit_items({"a": host}, tied=False, engine_in_process=False)[0][1] is host
    with pytest.raises(NotImplementedError, match="meta"):
        refit_items({"a": torch.empty(2, device="meta")}, tied=False, engine_in_process=False)


# ---- sleep and wake --------------------------------------------------------------------------------
def test_refit_while_asleep_wakes_weights_then_kv_cache():
    llm = FakeLLM()
    engine = EngineHandle(llm, sleep_mode=True, engine_in_process=True, tied=False)
    w = torch.ones(2)
    engine.sleep()
    engine.sleep()  # already asleep: no second call
    engine.load_weights({"w": w})
    assert llm.calls == [("sleep", 1), ("wake_up", ["weights"]), ("apply_model",), ("wake_up", ["kv_cache"]),
                         ("reset_prefix_cache",)]
    assert llm.model.loaded == [[("w", w)]] and not engine.asleep


def test_generation_wakes_a_sleeping_engine_once():
    llm = FakeLLM()
    engine = EngineHandle(llm, sleep_mode=True, engine_in_process=True, tied=False)
    engine.wake_up()  # awake: nothing to do
    engine.sleep()
    engine.wake_up()
    engine.wake_up()
    assert llm.calls == [("sleep", 1), ("wake_up", None)]


def test_without_sleep_mode_sleep_does_nothing():
    llm = FakeLLM()
    engine = EngineHandle(llm, sleep_mode=False, engine_in_process=True, tied=False)
    engine.sleep()
    engine.load_weights({"w": torch.ones(1)})
    assert llm.calls == [("apply_model",), ("reset_prefix_cache",)]


# ---- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value,expect", [
    ("gpu_memory_utilization", "0", "greater than 0"),
    ("gpu_memory_utilization", "1.5", "less than or equal to 1"),
    ("tensor_parallel_size", "0", "greater than or equal to 1"),
])
def test_vllm_cfg_ranges(key, value, expect):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"policy.generation.vllm_cfg.{key}={value}"])
    assert f"policy.generation.vllm_cfg.{key}" in str(e.value) and expect in str(e.value)


def test_vllm_cfg_defaults_follow_nemo_rl():
    v = load_config(None, []).policy.generation.vllm_cfg
    assert (v.gpu_memory_utilization, v.tensor_parallel_size, v.enable_sleep_mode) == (0.6, 1, False)


def test_gpu_only_settings_on_cpu_are_config_errors():
    from rlplane.config.vllm import VllmConfig, vllm_cfg_errors

    errors = vllm_cfg_errors("cpu", VllmConfig(tensor_parallel_size=2, enable_sleep_mode=True))
    assert len(errors) == 2
    assert errors[0].startswith("policy.generation.vllm_cfg.tensor_parallel_size = 2 with policy.device = cpu")
    assert errors[1].startswith("policy.generation.vllm_cfg.enable_sleep_mode = true with policy.device = cpu")
    assert vllm_cfg_errors("cuda", VllmConfig(tensor_parallel_size=2, enable_sleep_mode=True)) == []
    assert vllm_cfg_errors("auto", VllmConfig(tensor_parallel_size=2)) == []  # judged in the worker


def test_a_constructor_that_failed_early_closes_cleanly():
    # A settings error (check_engine_devices) or a missing vllm raises before the engine's model
    # directory exists; close() (run again by __del__) must not add an AttributeError to the one line.
    from rlplane.generation.vllm_backend import VLLMGenerationBackend

    backend = object.__new__(VLLMGenerationBackend)
    with pytest.raises((ImportError, ConfigError, AttributeError)):
        backend.__init__(None, None, tensor_parallel_size=8)
    backend.close()


def test_sleep_mode_with_async_grpo_is_a_config_error():
    # Checked through the async rule directly: backend=vllm cannot load where vllm is not installed.
    from types import SimpleNamespace as NS

    from rlplane.config.rules import async_without_vllm_sleep

    def cfg(sleep):
        return NS(algorithm="grpo", grpo=NS(async_grpo=NS(enabled=True)),
                  policy=NS(generation=NS(backend="vllm", vllm_cfg=NS(enable_sleep_mode=sleep))))

    assert async_without_vllm_sleep(cfg(False)) == []
    (err,) = async_without_vllm_sleep(cfg(True))
    assert err.startswith("policy.generation.vllm_cfg.enable_sleep_mode cannot run with grpo.async_grpo.enabled")
