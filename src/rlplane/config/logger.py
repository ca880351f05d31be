"""Logger settings (``logger.*``, NeMo RL's names): JSONL and TensorBoard on; wandb and MLflow off, lazily imported."""

from __future__ import annotations

from pydantic import Field

from rlplane.config.base import StrictModel


class WandbConfig(StrictModel):
    """Weights & Biases (NeMo RL ``logger.wandb``). Offline runs: set ``WANDB_MODE=offline``."""

    project: str = Field("rlplane", description="wandb project.")
    name: str | None = Field(None, description="Run name (null: the run directory's name).")
    entity: str | None = Field(None, description="Team or user (null: your default).")
    dir: str | None = Field(None, description="Where wandb writes its run directory (null: RUN_DIR/logs).")


class MlflowConfig(StrictModel):
    """MLflow (NeMo RL ``logger.mlflow``)."""

    experiment_name: str = Field("rlplane", description="MLflow experiment.")
    run_name: str | None = Field(None, description="Run name (null: the run directory's name).")
    tracking_uri: str | None = Field(
        None,
        description="Tracking store: a server URL, sqlite:///FILE, or file:DIR (null: sqlite:///LOG_DIR/mlflow.db).",
    )


class LoggerConfig(StrictModel):
    """Metric sinks (NeMo RL `logger.*`)."""

    log_dir: str | None = Field(None, description="Where (null = RUN_DIR/logs).")
    jsonl_enabled: bool = Field(True, description="metrics.jsonl, one line per step.")
    tensorboard_enabled: bool = Field(True, description="TensorBoard event files.")
    wandb_enabled: bool = Field(False, description="Log to Weights & Biases (needs rlplane[trackers]).")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="wandb settings.")
    mlflow_enabled: bool = Field(False, description="Log to MLflow (needs rlplane[trackers]).")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="MLflow settings.")
    connect_timeout_s: float = Field(30.0, gt=0, description="Seconds a tracking server (MLflow's tracking_uri, "
                                     "wandb's server) has to answer at start-up before the run stops with an error.")
    progress_bar: bool = Field(True, description="A progress bar on stderr when it is a terminal.")
    log_every_n_steps: int = Field(
        10, ge=1, description="Without a terminal (or progress_bar: false): one progress line per N steps."
    )
    num_val_samples_to_print: int = Field(
        3, ge=0, description="Validation samples printed as a table after each validation (all go to samples.jsonl)."
    )
    log_train_samples_every: int = Field(
        0, ge=0, description="Write the training samples (with advantages) to samples.jsonl every N steps (0: never)."
    )
