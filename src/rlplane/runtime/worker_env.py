"""The environment every worker process starts with (Ray actors, process actors, the Ray runtime)."""

# Passive OpenMP waits: a spinning neighbour slows a process many times over on few cores.
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
