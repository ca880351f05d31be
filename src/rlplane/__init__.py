"""rlplane: RL post-training of language models through a key-value data plane."""
__version__ = "0.1.0"

__all__ = ["evaluate", "load_config", "train"]


def __getattr__(name: str):
    # The Python API (rlplane.api) is imported on first use: `import rlplane` stays light.
    if name in __all__:
        from rlplane import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlplane' has no attribute {name!r}")
