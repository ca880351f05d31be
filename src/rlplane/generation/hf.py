"""The ``hf`` generation backend: a hand-written decode loop over a transformers causal LM.

Unlike ``model.generate`` it returns the processed logprobs of the chosen tokens and stops computing
finished rows: it prefills each distinct prompt once into a preallocated KV cache, then decodes the
running rows (Llama family and Gemma 3 through :mod:`rlplane.fast.fused_decode`, others through their own
forward; on CUDA the Llama family's steps replay CUDA graphs, :mod:`rlplane.fast.graph_decode`). Weights handed
over mid-generation (:class:`~rlplane.generation.interface.WeightSwap`) load before the next forward; the KV
cache of earlier positions is kept (NeMo RL's default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlplane.fast.allocator import keep_freed_memory, limit_malloc_arenas
from rlplane.fast.fused_decode import GEMMA_MODEL_TYPES, LlamaDecoder, unsupported_reason
from rlplane.fast.gemma_decode import Gemma3Decoder
from rlplane.fast.graph_decode import StaticDecoder, graph_unsupported_reason
from rlplane.fast.switches import CUDA_GRAPH_DECODE, FUSED_DECODE, enabled
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
from rlplane.generation.kv_cache import cache_kwarg, preallocated_cache
from rlplane.generation.sampling import sample
from rlplane.models.precision import FP32OutputLinear, autocast

# Compact the running batch (a copy of the KV cache) once this fraction of it has finished.
_COMPACT_FRACTION = 0.25
# The stop-string pre-check's (previous, newest) token-pair text cache is cleared at this many pairs.
_MAX_CACHED_PAIRS = 200_000


def _frozen_weights_cast(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{name: weight in the autocast dtype}`` for the frozen linear weights of ``model`` (not the fp32 head).

    Autocast re-casts a frozen weight at every use; passed pre-cast to ``functional_call`` they are cast
    once per ``generate``. Empty without autocast or when every weight requires grad.
    """
    if not torch.is_autocast_enabled(next(model.parameters()).device.type):
        return {}
    dtype = torch.get_autocast_dtype(next(model.parameters()).device.type)
    cast = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or isinstance(module, FP32OutputLinear):
            continue
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad and param.is_floating_point():
                cast[f"{module_name}.{name}" if module_name else name] = param.detach().to(dtype)
    return cast


class _HFStepper:
    """The decode steps through the model's own forward; twin of :class:`~rlplane.fast.fused_decode.LlamaDecoder`."""

    def __init__(self, backend: HFGenerationBackend, capacity: int):
        self.forward = backend._forward
        self.cache_kw = cache_kwarg(backend.model)
        if backend.kv_cache == "preallocated":
            self.cache = preallocated_cache(backend.model.config, capacity)
        else:
            self.cache = DynamicCache(config=backend.model.config)

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return self.forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            **{self.cache_kw: self.cache}, use_cache=True, logits_to_keep=1)[:, -1]  # (U, V)

    def expand(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)

    select = expand

    def decode(self, tokens, positions, attention_mask) -> torch.Tensor:
        return self.forward(input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=positions[:, None],
                            **{self.cache_kw: self.cache}, use_cache=True)[:, -1]  # (b, V)


class HFGenerationBackend(GenerationBackend):
    """Batched sampling from ``model`` as given (the trainer's own module when colocated, else refit a copy).

    ``decode``: ``"auto"`` (fused for llama, mistral, qwen2, gemma3_text, and on CUDA the llama family's steps
    replayed as CUDA graphs; else the model's forward), ``"hf"``, ``"fused"`` or ``"graph"`` (the static-shape
    step: captured on CUDA, eager elsewhere); ``last_decode`` says which ran (``"graph-eager"``: uncaptured).
    """

    shares_weights = True
    supports_row_seeds = True

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kv_cache: str = "preallocated",
                 decode: str = "auto", max_batch_size: int | None = None):
        if kv_cache not in ("preallocated", "dynamic"):
            raise ValueError(f"kv_cache = {kv_cache!r}: use 'preallocated' or 'dynamic' (transformers' DynamicCache)")
        if decode not in ("auto", "hf", "fused", "graph"):
            raise ValueError(f"decode = {decode!r}: use 'auto', 'hf' (the model's own forward), 'fused' (Llama family) "
                             "or 'graph' (Llama family, CUDA graphs)")
        if decode in ("fused", "graph") and kv_cache == "dynamic":
            raise ValueError(f"decode = {decode!r} has its own preallocated cache; "
                             "use kv_cache='preallocated' or decode='hf'")
        # Freed decode-step tensors stay in the heap from here on, in few arenas (rlplane/fast/allocator.py).
        keep_freed_memory()
        limit_malloc_arenas()
        self.kv_cache = kv_cache  # "dynamic" is kept to measure the difference (benchmarks/generation.py)
        # Rows per pass, at most (NeMo RL's policy.generation_batch_size): the KV cache is rows × length.
        self.max_batch_size = max_batch_size
        self.decode = decode
        self.last_decode: str | None = None
        self._active: LlamaDecoder | _HFStepper | None = None  # the running generation's stepper
        self._static: StaticDecoder | None = None  # kept between generations: its cache and CUDA graphs
        self.model = model
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
        self.stop_token_ids = default_stop_token_ids(model, tokenizer)
        self._added: dict[tuple[int, ...], str | None] = {}  # (previous, newest) -> text newest adds
        self._swap = WeightSwap(self._load_weights)
        self._cast_weights: dict[str, torch.Tensor] = {}  # during generate: see _frozen_weights_cast

    def sleep(self) -> None:
        """Free the model's weights while a colocated trainer needs the memory; :meth:`update_weights` reallocates."""
        self._static = None  # its weight copies, cache and graphs too (captured again after the wake)
        self._shapes = {id(p): p.shape for p in self.model.parameters()}
        for p in self.model.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    @property
    def asleep(self) -> bool:
        return bool(getattr(self, "_shapes", None))

    @property
    def weight_version(self) -> int | None:
        return self._swap.version

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy ``state_dict`` into the model in place (tied weights may come once); mid-generation at the next
        token; after :meth:`sleep` the weights are reallocated first."""
        if self.asleep:
            for p in self.model.parameters():
                p.data = torch.empty(self._shapes[id(p)], dtype=p.dtype, device=p.device)
            self._shapes = None
        self._swap.update(state_dict, version)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        if getattr(self.model.config, "tie_word_embeddings", False):
            tied.add("lm_head.weight")
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise ValueError(
                "update_weights: state_dict does not match the model: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        if self._cast_weights:  # an in-flight update inside generate: the frozen weights' casts follow it
            self._cast_weights = _frozen_weights_cast(self.model)
        if isinstance(self._active, LlamaDecoder):  # and the fused decoder's matrices
            self._active.load_weights()

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
        # A colocated trainer may share its module: sample in eval mode, then restore.
        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: under inference_mode autocast re-casts every weight each step.
            with torch.no_grad(), autocast(self.model), self._swap.generating():
                step = self.max_batch_size or max(1, len(prompt_ids))
                if len(prompt_ids) <= step:
                    return self._generate(
                        prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        top_k=top_k, greedy=greedy, stop_token_ids=stop_token_ids, stop_strings=stop_strings,
                        seed=seed, generator=generator, row_seeds=row_seeds,
                    )
                # In passes of max_batch_size rows; with row seeds a row draws the same tokens in any pass.
                rows = normalize_stop_strings(stop_strings, len(prompt_ids))
                generator = generator if generator is not None or seed is None else torch.Generator(
                    self.model.device).manual_seed(seed)
                parts = [self._generate(
                    prompt_ids[i:i + step], max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                    top_k=top_k, greedy=greedy, stop_token_ids=stop_token_ids,
                    stop_strings=None if rows is None else rows[i:i + step], seed=None, generator=generator,
                    row_seeds=None if row_seeds is None else row_seeds[i:i + step],
                ) for i in range(0, len(prompt_ids), step)]
                return GenerationOutput(
                    [x for o in parts for x in o.output_ids], [x for o in parts for x in o.logprobs],
                    [x for o in parts for x in o.finish_reasons],
                    None if any(o.versions is None for o in parts) else [x for o in parts for x in o.versions])
        finally:
            self._cast_weights = {}
            self._active = None  # frees the cache and the fused matrices
            self.model.train(was_training)

    def _stepper(self, capacity: int) -> LlamaDecoder | _HFStepper:
        """The static-shape decoder (captured on CUDA) or the fused decoder where ``decode``, the device and the
        model allow them, else the model's own forward."""
        device = self.model.device
        auto_graph = device.type == "cuda" and enabled(FUSED_DECODE) and enabled(CUDA_GRAPH_DECODE)
        if self.decode == "graph" or (self.decode == "auto" and auto_graph):
            reason = "kv_cache = 'dynamic'" if self.kv_cache == "dynamic" else graph_unsupported_reason(self.model,
                                                                                                         capacity)
            if reason is None:
                return self._static_decoder(capacity, capture=device.type == "cuda")
            if self.decode == "graph":
                raise ValueError(f"decode = 'graph': {reason}; use decode='auto' or 'hf' for this model")
        reason = "decode = 'hf'" if self.decode == "hf" else unsupported_reason(self.model, capacity)
        if reason is None and self.decode == "auto" and not enabled(FUSED_DECODE):
            reason = f"{FUSED_DECODE}=0"
        if self.kv_cache == "dynamic":
            reason = "kv_cache = 'dynamic'"
        if reason is None:
            self.last_decode = "fused"
            gemma = getattr(self.model.config, "model_type", None) in GEMMA_MODEL_TYPES
            return (Gemma3Decoder if gemma else LlamaDecoder)(self.model, capacity)
        if self.decode == "fused":
            raise ValueError(f"decode = 'fused': {reason}; use decode='auto' or 'hf' for this model")
        self.last_decode = "hf"
        self._cast_weights = _frozen_weights_cast(self.model)
        return _HFStepper(self, capacity)

    def _static_decoder(self, capacity: int, capture: bool) -> StaticDecoder:
        """The kept static decoder (a new one when the compute dtype or capture changed), set up for this call."""
        dtype = getattr(self.model, "rlplane_autocast_dtype", None) or self.model.model.embed_tokens.weight.dtype
        if self._static is None or self._static.capture != capture or self._static.dtype != dtype:
            self._static = None
            self._static = StaticDecoder(self.model, capture=capture)
        self._static.begin(capacity)
        self.last_decode = "graph" if capture else "graph-eager"
        return self._static

    def _forward(self, **kwargs) -> torch.Tensor:
        """The model's logits for ``kwargs``, with the frozen weights' bf16 copies (if any) in place of theirs."""
        if self._cast_weights:
            return torch.func.functional_call(self.model, self._cast_weights, args=(), kwargs=kwargs).logits
        return self.model(**kwargs).logits

    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int | None,
        greedy: bool,
        stop_token_ids: Sequence[int] | None,
        stop_strings: StopStrings,
        seed: int | None,
        generator: torch.Generator | None,
        row_seeds: Sequence[int] | None,
    ) -> GenerationOutput:
        batch_size = len(prompt_ids)
        if batch_size == 0:
            return GenerationOutput([], [], [])
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate: every prompt needs at least one token (the tokenizer's bos, for instance)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {max_new_tokens}: must be >= 1")
        if stop_token_ids is None:
            stop_token_ids = self.stop_token_ids
        row_stop_strings = normalize_stop_strings(stop_strings, batch_size)
        device = self.model.device
        if generator is None and seed is not None:
            generator = torch.Generator(device).manual_seed(seed)
        seeds = self._row_seeds(row_seeds, prompt_ids, greedy, device)  # None, or ((B,) seeds, (B,) prompt lengths)

        # Prefill each distinct prompt once, then copy its KV cache and last logits to its rows.
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompt_ids])  # (B,)
        unique_prompts = list(unique)

        # Left-pad the distinct prompts: (U, P); positions count real tokens only.
        lengths = torch.tensor([len(p) for p in unique_prompts])
        max_len = int(lengths.max())
        input_ids = torch.full((len(unique_prompts), max_len), self.pad_token_id, dtype=torch.long)
        for i, p in enumerate(unique_prompts):
            input_ids[i, max_len - len(p):] = torch.as_tensor(p, dtype=torch.long)
        attention_mask = (torch.arange(max_len)[None, :] >= (max_len - lengths)[:, None]).long()  # (U, P)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_(min=0)  # (U, P)
        input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))

        stepper = self._stepper(max_len + max_new_tokens)
        self._active = stepper  # an in-flight weight swap refreshes its weights (_load_weights)
        version = self._swap.boundary()  # of the weights that compute the logits of the next token
        logits = stepper.prefill(input_ids, attention_mask, position_ids)  # (U, V)
        if len(unique_prompts) < batch_size:
            row_to_unique = row_to_unique.to(device)
            stepper.expand(row_to_unique)
            logits, attention_mask, position_ids = (t[row_to_unique] for t in (logits, attention_mask, position_ids))

        out_tokens = torch.full((batch_size, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((batch_size, max_new_tokens), dtype=torch.float32, device=device)
        out_versions = torch.full((batch_size, max_new_tokens), -1, dtype=torch.long)  # -1: no version given
        gen_lengths = torch.full((batch_size,), max_new_tokens, dtype=torch.long, device=device)
        stop_ids = torch.as_tensor(list(stop_token_ids), dtype=torch.long, device=device)
        finished_by_stop = torch.zeros(batch_size, dtype=torch.bool, device=device)
        rows = torch.arange(batch_size, device=device)  # original index of each running row
        done = torch.zeros(batch_size, dtype=torch.bool, device=device)  # over running rows
        next_pos = position_ids[:, -1] + 1  # (B,)
        # Mask over prompt + generated positions, allocated once.
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch_size, max_new_tokens))], dim=-1)

        for step in range(max_new_tokens):
            tokens, logprobs = sample(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, generator=generator,
                # Per-row draws: counter = the token's position in its row.
                **({} if seeds is None else {"row_seeds": seeds[0][rows], "positions": seeds[1][rows] + step}),
            )  # (b,), (b,)
            tokens = tokens.masked_fill(done, self.pad_token_id)
            out_tokens[rows, step] = tokens
            out_logprobs[rows, step] = logprobs
            out_versions[rows.cpu(), step] = -1 if version is None else version
            newly_done = torch.isin(tokens, stop_ids) & ~done if stop_ids.numel() else torch.zeros_like(done)
            if row_stop_strings is not None:
                newly_done |= self._stop_string_hits(rows, done | newly_done, out_tokens, step, row_stop_strings)
            if bool(newly_done.any()):
                gen_lengths[rows[newly_done]] = step + 1
                finished_by_stop[rows[newly_done]] = True
                done = done | newly_done
                n_done = int(done.sum())
                if n_done == len(rows):
                    break
                # Drop finished rows once enough are idle.
                if n_done >= _COMPACT_FRACTION * len(rows) and step < max_new_tokens - 1:
                    keep = (~done).nonzero().squeeze(-1)
                    stepper.select(keep)
                    rows, tokens, attention_mask, next_pos = (t[keep] for t in (rows, tokens, attention_mask, next_pos))
                    done = done[keep]
            if step == max_new_tokens - 1:
                break
            version = self._swap.boundary()  # a token boundary: an in-flight weight update lands here
            logits = stepper.decode(tokens, next_pos, attention_mask[:, : max_len + step + 1])
            next_pos = next_pos + 1

        lengths_list = gen_lengths.tolist()
        tokens_list = out_tokens.tolist()
        return GenerationOutput(
            output_ids=[t[:n] for t, n in zip(tokens_list, lengths_list)],
            logprobs=[out_logprobs[i, :n].cpu() for i, n in enumerate(lengths_list)],
            finish_reasons=[FINISH_STOP if s else FINISH_LENGTH for s in finished_by_stop.tolist()],
            versions=None if version is None else [out_versions[i, :n] for i, n in enumerate(lengths_list)],
        )

    @staticmethod
    def _row_seeds(row_seeds, prompt_ids, greedy: bool, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``row_seeds`` and the prompts' lengths as (B,) int64 tensors, or None when not sampling by row."""
        if row_seeds is None or greedy:
            return None
        if len(row_seeds) != len(prompt_ids):
            raise ValueError(f"generate: {len(row_seeds)} row_seeds for {len(prompt_ids)} prompts; give one per prompt")
        lengths = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long, device=device)
        return torch.as_tensor(list(row_seeds), dtype=torch.long, device=device), lengths

    def _stop_string_hits(
        self,
        rows: torch.Tensor,
        done: torch.Tensor,
        out_tokens: torch.Tensor,
        step: int,
        row_stop_strings: list[tuple[str, ...]],
    ) -> torch.Tensor:
        """Running rows whose generated text now holds one of their stop strings; rows whose newly added text
        holds no stop string's last character are skipped."""
        hits = torch.zeros(len(rows), dtype=torch.bool, device=done.device)
        for j, (r, is_done) in enumerate(zip(rows.tolist(), done.tolist())):
            stops = row_stop_strings[r]
            if is_done or not stops:
                continue
            added = self._added_text(tuple(out_tokens[r, max(0, step - 1) : step + 1].tolist()))
            if added is not None and not any(s[-1] in added for s in stops):
                continue
            text = self.tokenizer.decode(out_tokens[r, : step + 1].tolist(), skip_special_tokens=False)
            if any(s in text for s in stops):
                hits[j] = True
        return hits

    def _added_text(self, window: tuple[int, ...]) -> str | None:
        """The text the last token of ``window`` adds after the one before it, decoded in context (sentencepiece
        spaces, split UTF-8); None when unsure (the caller then decodes the whole output)."""
        if window in self._added:
            return self._added[window]
        before = self.tokenizer.decode(list(window[:-1]), skip_special_tokens=False) if len(window) > 1 else ""
        after = self.tokenizer.decode(list(window), skip_special_tokens=False)
        added = None if "\ufffd" in after or not after.startswith(before) else after[len(before) :]
        if len(self._added) >= _MAX_CACHED_PAIRS:
            self._added.clear()
        self._added[window] = added
        return added
