"""Speed settings, each beside its plain twin and behind a switch (:mod:`rlplane.fast.switches`).

- :mod:`~rlplane.fast.fused_decode`: a fused Llama-family decode forward; twin: the model's own forward;
  off: ``policy.generation.hf_decode: hf`` or ``RLPLANE_FUSED_DECODE=0``. Its fp32 output projection
  through oneDNN; twin: ``F.linear``; off: ``RLPLANE_ONEDNN_LINEAR=0``.
- :mod:`~rlplane.fast.graph_decode`: on CUDA the decode step at fixed shapes (batch buckets, a static KV cache)
  captured as CUDA graphs; twin: the fused decode forward; off: ``policy.generation.hf_decode: fused`` or
  ``RLPLANE_CUDA_GRAPH_DECODE=0``.
- :mod:`~rlplane.fast.allocator`: glibc keeps freed memory; twin: glibc's defaults;
  off: ``RLPLANE_KEEP_FREED_MEMORY=0``. In few malloc arenas; twin: glibc's count; off: ``RLPLANE_FEW_ARENAS=0``.
- :mod:`~rlplane.fast.heap`: long-lived objects out of the garbage collector's full collections;
  twin: no ``gc.freeze``; off: ``RLPLANE_FREEZE_HEAP=0``.
- :mod:`~rlplane.fast.attention_backward`: a bf16 CPU training forward's attention differentiated by matmuls;
  twin: SDPA's own backward; off: ``RLPLANE_MATMUL_ATTENTION_BACKWARD=0``.
- :mod:`~rlplane.fast.sparse_embedding`: a large tied embedding's training gradient as the rows it touched;
  twin: the dense backward; off: ``RLPLANE_SPARSE_EMBEDDING_GRAD=0``.
- :mod:`~rlplane.fast.threads`: torch threads per worker and a lower priority for background threads;
  twin: torch's own count; off: ``RLPLANE_SET_THREADS=0``.

``RLPLANE_FAST=0`` turns all of them off. Each is tested against its twin (``tests/unit/fast``).
Process-wide settings are applied once, where a process or thread starts, never inside a forward.
Figures: ``docs/benchmarks.md``.
"""
