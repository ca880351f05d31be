"""Environment settings (``env.*``): one subsection per ``task_name``, passed as keyword arguments to its factory."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rlplane.config.base import StrictModel


class MathEnvConfig(StrictModel):
    """``task_name: math``: answers checked with math-verify in a pool of verifier processes."""

    num_workers: int = Field(2, ge=1, description="Verifier processes (each scores one answer at a time).")
    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")
    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify"] = Field(
        "hf_math_verify", description="The check (NeMo RL's key): `hf_math_verify` compares symbolically with "
        "math-verify; `dapo_math_verify` is DAPO's rule: the text after the last `Answer:`, normalised, equal to the "
        "reference (rlplane.verifiers.dapo_answer)."
    )


class ReasoningGymEnvConfig(StrictModel):
    """``task_name: reasoning_gym``: answers scored by the reasoning-gym task's own ``score_answer``."""

    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")
    num_workers: int = Field(1, ge=1, description="Scoring processes.")
    partial_credit: bool = Field(
        True,
        description="Keep the task's partial scores (e.g. 2/3 for '16.' against 16); false: 1 for a fully "
        "correct answer, else 0, so accuracy is the fraction exactly right.",
    )
    answer_format: Literal["any", "boxed", "answer_tag", "lenient"] = Field(
        "any",
        description="Where the answer is read: `any` = the last \\boxed{}, else <answer> tag, else 'answer is X', "
        "else the last line; `boxed` / `answer_tag`: only that format counts (strict: a right answer written "
        "another way scores 0); `lenient`: like `any` with quotes and a final period dropped, and without a "
        "marked answer the best of the last line, the value it ends on ('The GCD of 3 and 5 is 1.' -> 1) and its "
        "last number.",
    )
class CalculatorEnvConfig(StrictModel):
    """The calculator tool (``rlplane.envs.calculator``)."""

    max_tool_calls: int = Field(1, ge=0, description="Tool calls per sample before every "
                                                     "response counts as the answer.")


class CodeEnvConfig(StrictModel):
    """Python run against tests in the sandbox (``rlplane.envs.code``, ``rlplane.envs.sandbox``)."""

    cpu_seconds: float = Field(2.0, gt=0, description="CPU time per program (RLIMIT_CPU).")
    wall_seconds: float = Field(5.0, gt=0, description="Elapsed time per program before it is killed.")
    memory_mb: int = Field(512, ge=64, description="Address space per program (RLIMIT_AS), MiB.")
    output_kb: int = Field(64, ge=1, description="stdout and stderr each, KiB (longer output kills the program).")
    num_workers: int = Field(2, ge=1, description="Programs run at once.")
    max_attempts: int = Field(1, ge=1, description="Attempts per sample (> 1: the error "
                                                   "is fed back; needs max_rollout_turns).")


class GuessNumberEnvConfig(StrictModel):
    """The number-guessing game (``rlplane.envs.guess_number``)."""

    low: int = Field(0, ge=0, description="Smallest secret.")
    high: int = Field(63, ge=0, description="Largest secret.")

    @model_validator(mode="after")
    def _range(self) -> "GuessNumberEnvConfig":
        if self.low > self.high:
            raise ValueError(f"low = {self.low} > high = {self.high}; swap them")
        return self


class SlidingPuzzleEnvConfig(StrictModel):
    """NeMo RL's sliding-puzzle game (``rlplane.envs.sliding_puzzle``; NeMo RL's ``cfg.game_config`` and
    ``cfg.max_moves``)."""

    size: int = Field(3, ge=2, description="Largest board side; each puzzle draws a side from 2 to this.")
    shuffle_moves: int = Field(10, ge=1, description="Most random gap moves that shuffle a board (an odd count "
                                                     "from 1 to this).")
    max_moves: int = Field(30, ge=1, description="Moves per game before it ends unrewarded.")


class UserTaskConfig(StrictModel):
    """A user's task, ``env.<task_name>``: a reward function or an environment class named by import path.

    Paths are ``module:attribute``, imported relative to the working directory or from an installed
    package, inside the process that runs the environment (this one, or the Ray rollout actor).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True,
                              serialize_by_alias=True)

    reward_fn: str | None = Field(
        None, description="module:function(prompt, completion, extra) -> float (or a list of floats, summed)."
    )
    class_: str | None = Field(None, alias="class", description="module:Class, an rlplane.envs.Environment.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the class or function.")

    @model_validator(mode="after")
    def _one_of(self) -> "UserTaskConfig":
        if (self.reward_fn is None) == (self.class_ is None):
            raise ValueError("reward_fn: set exactly one of reward_fn=module:function or class=module:Class")
        for key, path in (("reward_fn", self.reward_fn), ("class", self.class_)):
            if path is not None and (path.count(":") != 1 or not all(path.split(":"))):
                raise ValueError(f"{key} = {path!r}: expected module:attribute, e.g. my_rewards:score")
        return self


class EnvConfig(StrictModel):
    """Per-environment settings; add a field named after the environment's ``task_name``.

    Any other key names a user task (:class:`UserTaskConfig`): ``env.my_task.reward_fn=my_rewards:score``.
    """

    # Extra keys are user tasks, validated as UserTaskConfig.
    model_config = ConfigDict(extra="allow", frozen=True, validate_default=True)
    __pydantic_extra__: dict[str, UserTaskConfig]

    @model_validator(mode="before")
    @classmethod
    def _extra_keys_are_user_tasks(cls, data):
        """A key that is neither a built-in section nor a user task is most likely a typo: say so."""
        if not isinstance(data, dict):
            return data
        import difflib

        builtin = list(cls.model_fields)
        for key, value in data.items():
            if key in builtin or (isinstance(value, dict) and ("reward_fn" in value or "class" in value)):
                continue
            close = difflib.get_close_matches(key, builtin, n=1, cutoff=0.5)
            hint = f"did you mean env.{close[0]}? " if close else ""
            raise ValueError(
                f"{key}: not an environment section ({', '.join(builtin)}) nor a user task; {hint}a user task "
                f"needs env.{key}.reward_fn=module:function or env.{key}.class=module:Class"
            )
        return data

    step_timeout_s: float | None = Field(
        600.0, gt=0, description="Seconds one environment step (a task's batch, one turn) may take before the run "
        "stops with an error naming the task (null = wait forever). Applies to every task."
    )
    max_error_rate: float | None = Field(
        0.5, ge=0, lt=1, description="Stop the run when environments failed (raised, or returned something "
        "malformed) on more than this share of the samples over the last error_window_steps steps (null = never)."
    )
    error_window_steps: int = Field(5, ge=1, description="Steps over which max_error_rate is judged.")
    actors_per_env: int = Field(
        1, ge=0, description="runtime=ray: Ray actors in each environment's pool; a task's samples of a step are "
        "split over its pool's actors (0: environments run inside the rollout actor). runtime=local: unused."
    )
    actors: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="Pool size of one environment, by task_name, in place of actors_per_env "
        "(env.actors.math=4)."
    )
    start_timeout_s: float = Field(
        120.0, gt=0, description="runtime=ray: seconds every environment actor has to start and build its "
        "environment (a constructor that connects to a judge server included) before the run stops with an error."
    )
    cpus_per_actor: float = Field(
        0.0, ge=0, description="CPUs each environment actor reserves from Ray (0: scheduled anywhere, sharing the "
        "node's CPUs; give more to an environment whose step is heavy)."
    )
    val_task_to_env: dict[str, str] = Field(
        default_factory=dict, description="Validation samples of a task_name scored by another environment (a "
        "registered name or a user task, with its own env.<name> settings), in pools of their own under "
        "runtime=ray: env.val_task_to_env.math=math_strict. Unnamed tasks validate on their training environment."
    )
    math: MathEnvConfig = Field(default_factory=MathEnvConfig, description="The math-verify environment.")
    reasoning_gym: ReasoningGymEnvConfig = Field(
        default_factory=ReasoningGymEnvConfig, description="The reasoning-gym environment."
    )
    calculator: CalculatorEnvConfig = Field(default_factory=CalculatorEnvConfig, description="Calculator tool.")
    code: CodeEnvConfig = Field(default_factory=CodeEnvConfig, description="Code execution in the sandbox.")
    guess_number: GuessNumberEnvConfig = Field(default_factory=GuessNumberEnvConfig, description="Guessing game.")
    math_multi_reward: MathEnvConfig = Field(
        default_factory=MathEnvConfig, description="NeMo RL's three-part math reward for GDPO (correctness, integer, "
        "format; string checks, so its num_workers and timeout_s go unused)."
    )
    sliding_puzzle_game: SlidingPuzzleEnvConfig = Field(
        default_factory=SlidingPuzzleEnvConfig, description="NeMo RL's sliding-puzzle game (multi-turn)."
    )

    def env_kwargs(self, task_name: str) -> dict[str, Any]:
        """Keyword arguments for ``task_name``'s factory ({} when it has no subsection)."""
        section = getattr(self, task_name, None)
        if isinstance(section, UserTaskConfig):
            return dict(section.kwargs)
        return section.model_dump() if isinstance(section, StrictModel) else {}

    def pool_size(self, task_name: str) -> int:
        """Actors in ``task_name``'s pool (``env.actors``, else ``env.actors_per_env``)."""
        return self.actors.get(task_name, self.actors_per_env)

    def user_tasks(self) -> dict[str, UserTaskConfig]:
        """The user tasks named in the config, by task name."""
        return dict(self.__pydantic_extra__ or {})
