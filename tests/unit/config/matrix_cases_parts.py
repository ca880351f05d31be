"""Bad-input matrix, the run's parts: environment actor pools, weight-sync checks, the watchdog, early stop,
start-up deadlines, and the Python API's injectable parts. CLI cases: (id, argv, setup or None, expected:
"one-line" | "runs"); API cases: (id, call(world, t), expected). Run and judged by ``test_bad_input_matrix.py``.

Two surfaces have a place here for their cases, kept empty until they land: seeds and controls
(``SEED_AND_CONTROL_CASES``) and NeMo RL's registry datasets (``REGISTRY_DATASET_CASES``)."""

from __future__ import annotations

import matrix_cases as C

import rlplane

T, TINY = C.T, C.TINY
VAL = ["grpo.val_period=1", "grpo.max_val_samples=4", "grpo.val_batch_size=4"]
CASES: list[tuple[str, list[str], object, str]] = []


def case(cid: str, argv: list[str], setup=None, expect: str = "one-line") -> None:
    CASES.append((cid, argv, setup, expect))


# ---- environment actor pools (env.actors_per_env, env.actors.<task>, env.val_task_to_env, ...)
for cid, ov in [
    ("pools/actors-negative", ["env.actors_per_env=-1"]), ("pools/actors-not-int", ["env.actors_per_env=two"]),
    ("pools/actors-fraction", ["env.actors_per_env=1.5"]), ("pools/task-actors-negative", ["env.actors.arithmetic=-2"]),
    ("pools/task-actors-not-mapping", ["env.actors=4"]), ("pools/cpus-negative", ["env.cpus_per_actor=-1"]),
    ("pools/start-timeout-zero", ["env.start_timeout_s=0"]),
    ("pools/start-timeout-words", ["env.start_timeout_s=soon"]),
    ("pools/val-env-unknown", ["env.val_task_to_env.arithmetic=no_such_env"]),
    ("pools/val-map-not-mapping", ["env.val_task_to_env=arithmetic"]),
    ("pools/step-timeout-zero", ["env.step_timeout_s=0"]),
]:
    case(cid, ["train", *T, *ov])
case("pools/runs-actors-unused-locally", ["train", *T, "env.actors_per_env=4", "env.actors.arithmetic=2"],
     expect="runs")
case("pools/runs-val-env-mapped", ["train", *T, *VAL, "env.val_task_to_env.arithmetic=calculator"], expect="runs")

# ---- weight-sync checks (policy.generation.verify_weights, verify_probe_every) and generators
G = "policy.generation"
for cid, ov in [
    ("sync/verify-maybe", [f"{G}.verify_weights=maybe"]), ("sync/verify-number", [f"{G}.verify_weights=1"]),
    ("sync/probe-every-negative", [f"{G}.verify_probe_every=-3"]),
    ("sync/probe-every-true", [f"{G}.verify_probe_every=true"]),
    ("sync/generators-zero", [f"{G}.num_generators=0"]),
    ("sync/generators-async-2", [f"{G}.num_generators=2", "runtime=ray", "data_plane.backend=ray",
                                 "grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]),
    ("sync/in-flight-not-bool", ["grpo.async_grpo.in_flight_weight_updates=sometimes"]),
]:
    case(cid, ["train", *T, *ov])
for cid, mode in [("sync/runs-verify-off", "off"), ("sync/runs-verify-warn", "warn")]:
    case(cid, ["train", *T, f"{G}.verify_weights={mode}", f"{G}.verify_probe_every=1"], expect="runs")
case("sync/runs-probe-never", ["train", *T, f"{G}.verify_probe_every=0"], expect="runs")  # 0: documented "never"

# ---- the watchdog (grpo.watchdog_s / ppo.watchdog_s)
for cid, ov in [("watchdog/zero", ["grpo.watchdog_s=0"]), ("watchdog/negative", ["grpo.watchdog_s=-5"]),
                ("watchdog/words", ["grpo.watchdog_s=forever"]), ("watchdog/nan", ["grpo.watchdog_s=.nan"])]:
    case(cid, ["train", *T, *ov])
case("watchdog/ppo-zero", ["train", "-c", "ppo_arithmetic", "--quiet", "run_dir={t}/r", "ppo.watchdog_s=0"])
case("watchdog/runs-null", ["train", *T, "grpo.watchdog_s=null"], expect="runs")
case("watchdog/runs-infinite", ["train", *T, "grpo.watchdog_s=.inf"], expect="runs")  # never fires, as null

# ---- early stop (--early-stop, early_stop.*)
for cid, ov in [
    ("early_stop/patience-zero", ["early_stop.enabled=true", "early_stop.patience=0", *VAL]),
    ("early_stop/patience-words", ["early_stop.patience=three"]),
    ("early_stop/min-delta-negative", ["early_stop.min_delta=-0.1"]),
    ("early_stop/max-drop-negative", ["early_stop.max_drop=-1"]),
    ("early_stop/metric-unknown", ["early_stop.enabled=true", "early_stop.metric=nope", *VAL]),
    ("early_stop/no-validation", ["early_stop.enabled=true"]),
    ("early_stop/enabled-maybe", ["early_stop.enabled=maybe"]),
    ("early_stop/unknown-key", ["early_stop.patiense=3"]),
]:
    case(cid, ["train", *T, *ov])
case("early_stop/flag-without-validation", ["train", "--early-stop", *T])
case("early_stop/runs-flag", ["train", "--early-stop", *T, *VAL], expect="runs")
case("early_stop/runs-max-drop", ["train", *T, *VAL, "early_stop.enabled=true", "early_stop.max_drop=0.5"],
     expect="runs")

# ---- start-up deadlines' own keys (the handshakes themselves: test_server_deadlines.py and SERVER_CASES)
for cid, ov in [("deadline/cluster-connect-zero", ["cluster.connect_timeout_s=0"]),
                ("deadline/logger-connect-negative", ["logger.connect_timeout_s=-1"]),
                ("deadline/cluster-connect-words", ["cluster.connect_timeout_s=long"])]:
    case(cid, ["train", *T, *ov])
case("deadline/runs-short-deadlines", ["train", *T, "cluster.connect_timeout_s=0.5", "logger.connect_timeout_s=0.5"],
     expect="runs")

# ---- seeds and controls (rlplane sweep, grpo.reward_control): their cases go here
SEED_AND_CONTROL_CASES: list[tuple[str, list[str], object, str]] = []
# ---- NeMo RL registry datasets (data.train.dataset_name from NeMo RL's registry): their cases go here
REGISTRY_DATASET_CASES: list[tuple[str, list[str], object, str]] = []
CASES += SEED_AND_CONTROL_CASES + REGISTRY_DATASET_CASES


# ---- the Python API's injectable parts: rlplane.train(loss_fn=, dataset=, dataloader=, logger=, policy=, ...)
def _tiny(t, *extra) -> list[str]:
    return [*TINY, f"run_dir={t}/r", *extra]


class _NoMethods:
    pass


class _Logger:
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append(step)


class _RaisingLogger:
    def log_metrics(self, metrics, step):
        raise RuntimeError("tracker offline")


def _shared_bomb() -> dict:
    level = ["lol"] * 9
    for _ in range(8):
        level = [level] * 9
    return {"grpo": {"x": level}}


def _cyclic() -> dict:
    tree: dict = {"grpo": {}}
    tree["grpo"]["self"] = tree
    return tree


def _deep() -> dict:
    tree: dict = {}
    node = tree
    for _ in range(2000):
        node["x"] = {}
        node = node["x"]
    return tree


API_CASES = [
    ("api/config-an-int", lambda w, t: rlplane.load_config(5), "one-line"),
    ("api/config-a-list", lambda w, t: rlplane.train([1, 2]), "one-line"),
    ("api/overrides-a-string", lambda w, t: rlplane.load_config(None, "grpo.max_num_steps=3"), "one-line"),
    ("api/overrides-not-strings", lambda w, t: rlplane.load_config(None, [("grpo.max_num_steps", 3)]), "one-line"),
    ("api/config-dict-bomb", lambda w, t: rlplane.load_config(_shared_bomb()), "one-line"),
    ("api/config-dict-cycle", lambda w, t: rlplane.load_config(_cyclic()), "one-line"),
    ("api/config-dict-2000-deep", lambda w, t: rlplane.load_config(_deep()), "one-line"),
    ("api/config-dict-defaults-list", lambda w, t: rlplane.load_config({"defaults": ["a", "b"]}), "one-line"),
    ("api/policy-without-methods", lambda w, t: rlplane.train(overrides=_tiny(t), policy=_NoMethods(), quiet=True),
     "one-line"),
    ("api/generation-without-methods", lambda w, t: rlplane.train(overrides=_tiny(t), policy_generation=_NoMethods(),
                                                                  quiet=True), "one-line"),
    ("api/checkpointer-without-methods", lambda w, t: rlplane.train(overrides=_tiny(t), checkpointer=_NoMethods(),
                                                                    quiet=True), "one-line"),
    ("api/dataset-and-dataloader", lambda w, t: rlplane.train(overrides=_tiny(t), dataset=[], dataloader=[],
                                                              quiet=True), "one-line"),
    ("api/task-to-env-under-ray", lambda w, t: rlplane.train(
        overrides=_tiny(t, "runtime=ray", "data_plane.backend=ray"), task_to_env={"arithmetic": object()}, quiet=True),
     "one-line"),
    ("api/reward-fn-not-callable", lambda w, t: rlplane.train(overrides=_tiny(t), reward_fns={"arithmetic": 5},
                                                              quiet=True), "one-line"),
    ("api/logger-raises", lambda w, t: rlplane.train(overrides=_tiny(t), logger=_RaisingLogger(), quiet=True),
     "one-line"),
    ("api/logger-without-log", lambda w, t: rlplane.train(overrides=_tiny(t), logger=_NoMethods(), quiet=True),
     "one-line"),
    ("api/runs-logger", lambda w, t: rlplane.train(overrides=_tiny(t), logger=_Logger(), quiet=True), "runs"),
    ("api/runs-config-dict", lambda w, t: rlplane.train(
        {"defaults": "grpo_arithmetic", "grpo": {"max_num_steps": 1}}, overrides=_tiny(t, "grpo.max_num_steps=1"),
        quiet=True), "runs"),
]


# ---- start-up handshakes with a server that accepts and never answers: one interpreter for all of them
class SilentServer:
    """Accepts every connection on 127.0.0.1, reads nothing, says nothing, until closed."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def server_cases(port: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """(id, argv with {t}, environment): every handshake at start-up, each with a 2 s deadline."""
    addr, ray = f"127.0.0.1:{port}", ["runtime=ray", "data_plane.backend=ray", "cluster.connect_timeout_s=2"]
    run = ["train", *T]
    return [
        ("server/ray-head", [*run, *ray, f"cluster.address={addr}"], {}),
        ("server/ray-address-variable", [*run, *ray], {"RAY_ADDRESS": addr}),
        ("server/ray-client", [*run, *ray, f"cluster.address=ray://{addr}"], {}),
        ("server/mlflow-http", [*run, "logger.mlflow_enabled=true", f"logger.mlflow.tracking_uri=http://{addr}",
                                "logger.connect_timeout_s=2"], {}),
        ("server/mlflow-https", [*run, "logger.mlflow_enabled=true", f"logger.mlflow.tracking_uri=https://{addr}",
                                 "logger.connect_timeout_s=2"], {}),
        ("server/wandb", [*run, "logger.wandb_enabled=true", "logger.connect_timeout_s=2"],
         {"WANDB_BASE_URL": f"http://{addr}", "WANDB_API_KEY": "x" * 40, "WANDB_MODE": "online"}),
        ("server/hf-hub", [*run, "policy.model_name=someorg/somemodel"],
         {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://{addr}"}),
    ]
