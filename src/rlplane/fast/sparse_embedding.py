"""A large tied input embedding's gradient as the rows the batch touched, not a dense zero matrix per micro-batch.

With tied embeddings the output head already sends a dense gradient to the one shared weight in every backward; the
input embedding's own part touches only the rows of the batch's tokens. ``nn.Embedding``'s dense backward makes a
fresh (vocabulary x hidden) matrix for it each micro-batch, zeroes it and adds it in (SmolLM2: 49152 x 576 floats,
113 MB; Gemma 3: 262144 x 640, 671 MB). Sparse, autograd adds the touched rows into the head's gradient. The same
gradient up to the order in which a repeated token's rows are summed.

Applied to a trained model whose input and output embeddings share one weight of at least :data:`MIN_ELEMENTS`
elements (the tiny embedded models keep the dense path: their numbers stay as they were), not under FSDP.
Twin: the dense backward; off: ``RLPLANE_SPARSE_EMBEDDING_GRAD=0``.
"""

from __future__ import annotations

import torch

from rlplane.fast.switches import SPARSE_EMBEDDING_GRAD, enabled

MIN_ELEMENTS = 1 << 20  # a million weights: below it the dense matrix costs little


def _tied_embedding(model: torch.nn.Module) -> torch.nn.Embedding | None:
    """The input embedding when it is an ``nn.Embedding`` sharing its weight with the output head, else None."""
    if not hasattr(model, "get_input_embeddings") or not hasattr(model, "get_output_embeddings"):
        return None
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not isinstance(emb, torch.nn.Embedding) or head is None or getattr(head, "weight", None) is not emb.weight:
        return None
    return emb


def sparse_embedding_grad(model: torch.nn.Module, on: bool = True) -> bool:
    """Switch the tied input embedding of ``model`` to sparse gradients (``on``) or back to dense; whether it is
    sparse now. Off for an untied, frozen or small embedding, or with the switch off."""
    emb = _tied_embedding(model)
    if emb is None:
        return False
    emb.sparse = (on and enabled(SPARSE_EMBEDDING_GRAD) and emb.weight.requires_grad
                  and emb.weight.numel() >= MIN_ELEMENTS)
    return emb.sparse


def densify_embedding_grad(model: torch.nn.Module) -> None:
    """A backward that reached the input embedding but not the head leaves a sparse ``.grad``: make it dense for
    the clip and the optimizer (a no-op otherwise)."""
    emb = _tied_embedding(model)
    if emb is not None and emb.weight.grad is not None and emb.weight.grad.is_sparse:
        emb.weight.grad = emb.weight.grad.to_dense()
