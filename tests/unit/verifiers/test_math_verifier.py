"""math-verify scoring: equivalent forms, wrong and malformed answers, and the pool's deadline,
from the main thread, other threads and a Ray actor."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("math_verify", reason="needs the math extra: pip install 'rlplane[math]'")

from rlplane.envs.math_env import MathEnv  # noqa: E402
from rlplane.verifiers.math_answer import boxed_reference, verify_math_answer  # noqa: E402
from rlplane.verifiers.pool import VerifierPool  # noqa: E402

# (response, reference, expected score)
CASES = [
    (r"\boxed{1/2}", "0.5", 1.0),
    (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
    (r"so we get \boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),
    ("12+35=47", "47", 1.0),  # no box: the plain expression's value
    (r"\boxed{1/3}", "0.5", 0.0),
    (r"\boxed{48}", "47", 0.0),
    (r"\boxed{\frac{1}{", "0.5", 0.0),  # malformed LaTeX: scored 0, no exception
    (r"\boxed{\sqrt{}}", "2", 0.0),
    ("I do not know", "3", 0.0),
    ("", "3", 0.0),
]
HANGS = r"\boxed{9^{9^{9^{9}}}}"  # sympy tries to evaluate this tower and never returns


def test_boxed_reference_wraps_once():
    assert boxed_reference(" 47 ") == r"\boxed{47}"
    assert boxed_reference(r"\boxed{47}") == r"\boxed{47}"


@pytest.mark.parametrize("response, reference, expected", CASES)
def test_verify_math_answer(response, reference, expected):
    score, _ = verify_math_answer(response, reference)
    assert score == expected


def test_verify_in_a_thread_has_no_signal_errors():
    # math-verify's default timeouts call signal.alarm, which raises outside the main thread.
    out = []
    t = threading.Thread(target=lambda: out.extend(verify_math_answer(r, g)[0] for r, g, _ in CASES))
    t.start()
    t.join()
    assert out == [e for _, _, e in CASES]


@pytest.fixture(scope="module")
def env():
    e = MathEnv(num_workers=2, timeout_s=6.0)  # a real case can take seconds on a loaded 2-core machine
    yield e
    e.close()


def _logs(responses):
    return [[{"role": "user", "content": "q"}, {"role": "assistant", "content": r}] for r in responses]


def test_math_env_scores_cases_from_threads(env):
    responses = [r for r, _, _ in CASES]
    meta = [{"ground_truth": g} for _, g, _ in CASES]
    results = [None] * 3

    def run(i):
        results[i] = env.step(_logs(responses), meta).rewards.tolist()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[e for _, _, e in CASES]] * 3


def test_hanging_verifier_is_cut_off_and_scores_zero(env):
    logs = _logs([r"\boxed{2}", HANGS, r"\boxed{3}", r"\boxed{4}"])
    meta = [{"ground_truth": g} for g in ("2", "1", "3", "5")]
    t0 = time.monotonic()
    ret = env.step(logs, meta)
    elapsed = time.monotonic() - t0
    assert ret.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert ret.answers[1] is None and any("timed out" in e for e in env.pool.last_errors)
    assert elapsed < 30  # cut off near timeout_s = 2, never the ~forever sympy would take
    # The killed worker was replaced: the pool keeps scoring.
    assert env.step(_logs([r"\boxed{1/2}"]), [{"ground_truth": "0.5"}]).rewards.tolist() == [1.0]


def test_pool_reports_errors_as_none():
    pool = VerifierPool("math:sqrt", num_workers=1, timeout_s=5)
    try:
        assert pool.map([(4.0,), (-1.0,), (9.0,)]) == [2.0, None, 3.0]
        assert pool.last_errors and "item 1" in pool.last_errors[0]
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.ray
def test_math_env_in_a_threaded_ray_actor(ray_session):
    ray = ray_session

    # The library class itself as a threaded actor: calls run in its thread pool, off the main thread.
    actor = ray.remote(num_cpus=0, max_concurrency=4)(MathEnv).remote(num_workers=1, timeout_s=6.0)
    responses, refs = [r for r, _, _ in CASES] + [HANGS], [g for _, g, _ in CASES] + ["1"]
    meta = [{"ground_truth": g} for g in refs]
    out = ray.get([actor.step.remote(_logs(responses), meta) for _ in range(2)], timeout=120)
    assert [o.rewards.tolist() for o in out] == [[e for _, _, e in CASES] + [0.0]] * 2
    ray.kill(actor)



def test_pool_workers_survive_a_group_sigint_or_sighup():
    import os
    import signal

    pool = VerifierPool("math:sqrt", num_workers=1, timeout_s=30.0)
    try:
        assert pool.map([(4.0,)]) == [2.0]
        (worker,) = pool._workers
        for sig in (signal.SIGINT, signal.SIGHUP):
            os.kill(worker.proc.pid, sig)
        time.sleep(0.2)
        assert pool.map([(9.0,)]) == [3.0]
        assert worker.proc.is_alive() and pool._workers == [worker]
    finally:
        pool.close()
