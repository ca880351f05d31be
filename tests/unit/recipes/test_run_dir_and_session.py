"""Run-directory handling and start-up checks of a session (issue 16, item 14)."""

from __future__ import annotations

import pytest

from rlplane.cli import main
from rlplane.config.loading import ConfigError, load_config
from rlplane.utils.logging import read_metrics
from tests.tiny import TINY_RUN

TINY = list(TINY_RUN)


def test_overlong_prompts_with_a_progress_bar_do_not_crash_the_session(tmp_path, capsys, tiny_run):
    """The 'skipped N prompts' notice came before Session._bar existed: AttributeError on any run with a bar."""
    from rlplane.training import Session

    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1=", "answer": "2"}\n' * 2 + '{"problem": "' + "1" * 40 + '+1=", "answer": "2"}\n')
    cfg = tiny_run("data.dataset=jsonl", f"data.train.path={data}", "logger.progress_bar=true",
                   "data.on_overlong_prompt=skip")
    s = Session(cfg, quiet=False)
    s.close()
    assert "skipped 1 prompts longer than policy.max_total_sequence_length" in capsys.readouterr().err


def test_ray_actors_that_cannot_fit_the_cluster_are_refused():
    from rlplane.training.plan import build_plan
    from rlplane.training.workers import check_ray_resources, ray_cpu_demand

    plan = build_plan(load_config(None, ["runtime=ray", "data_plane.backend=ray", "policy.dp_size=8"]))
    assert ray_cpu_demand(plan) == 8 * 0.5 + 0.5  # policy ranks + the rollout actor
    with pytest.raises(ConfigError, match=r"policy.dp_size = 8: the Ray actors need 4.5 CPUs \(8 policy × 0.5 "
                                          r"\+ 1 generator × 0.5\) but the Ray cluster has 2"):
        check_ray_resources(plan, cluster_cpus=2)
    check_ray_resources(plan, cluster_cpus=4.5)  # fits exactly
    ppo = load_config("ppo_arithmetic", ["runtime=ray", "data_plane.backend=ray", "policy.dp_size=2"])
    assert ray_cpu_demand(build_plan(ppo)) == 2 * 0.5 + 0.5 + 2 * 0.25  # the plan's critic: a rank per policy rank


def test_a_new_run_refuses_an_earlier_one_unless_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", *TINY, f"run_dir={run}"]) == 0
    first = (run / "checkpoints" / "step_2" / "training_info.json").read_text()
    capsys.readouterr()

    assert main(["train", "--quiet", *TINY, f"run_dir={run}", "grpo.max_num_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an earlier run" in err[0] and "--overwrite" in err[0]
    assert (run / "checkpoints" / "step_2" / "training_info.json").read_text() == first  # untouched

    assert main(["train", "--quiet", "--overwrite", *TINY, f"run_dir={run}", "grpo.max_num_steps=1"]) == 0
    # The earlier run's step_2 would otherwise be "latest" for eval/export/resume.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert [r["step"] for r in read_metrics(run / "logs")] == [1]

    # Resuming is continuing, not overwriting: allowed without the flag.
    assert main(["train", "--quiet", *TINY, f"run_dir={run}", "checkpointing.resume=true"]) == 0
    assert [r["step"] for r in read_metrics(run / "logs")] == [1, 2]


def test_a_run_that_failed_its_checks_leaves_nothing_that_blocks_the_next(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", *TINY, f"run_dir={run}", "data.dataset=jsonl",
                 f"data.train.path={tmp_path / 'missing.jsonl'}"]) == 2
    assert main(["train", "--quiet", *TINY, f"run_dir={run}"]) == 0


def test_eval_output_is_checked_before_and_written_after(tmp_path, capsys):
    out = tmp_path / "new" / "eval.json"
    argv = ["eval", "--quiet", "--model", "embedded:tiny-llama", "-n", "2", "-o", str(out),
            "policy.tiny.hidden_size=16", "policy.tiny.intermediate_size=16", "policy.tiny.num_layers=1"]
    assert main(argv) == 0 and '"num_problems": 2' in out.read_text()
    # max_new_tokens above the preset's sequence cap is fine for eval: it sizes the cap itself.
    assert main([*argv, "--max-new-tokens", "40"]) == 0 and '"max_new_tokens": 40' in out.read_text()


def test_the_session_freezes_the_heap_for_the_gc_while_it_runs_and_unfreezes_it_on_close(tiny_run):
    """start() moves what is alive out of the cyclic GC's full collections (they cost ~6 ms a step in
    the default job); close() hands it back, so what the session held can be collected again."""
    import gc

    from rlplane.training import Session

    gc.unfreeze()  # whatever an earlier test left
    s = Session(tiny_run("checkpointing.enabled=false"), quiet=True)
    try:
        assert gc.get_freeze_count() == 0  # not before the run has started
        s.start()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        built_after_start = [[i] for i in range(10_000)]  # as a recipe's collector builds its model copy
        s.begin_step(0)  # the first step freezes once more
        assert gc.get_freeze_count() >= frozen + len(built_after_start)
        frozen = gc.get_freeze_count()
        made_by_step_0 = [[i] for i in range(10_000)]
        s.begin_step(1)  # ... and only the first: a step's own objects are collected as usual
        assert gc.get_freeze_count() == frozen and len(made_by_step_0) == 10_000
    finally:
        s.close()
    assert gc.get_freeze_count() == 0
