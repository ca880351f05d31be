"""rlplane: RL post-training of language models through a key-value data plane."""
__version__ = "0.1.0"
