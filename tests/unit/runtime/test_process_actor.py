"""The process-hosted local actor: calls and errors as the thread and Ray actors have them, shared
memory for staged tensors, a clean close, and no child left behind by a parent killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlplane.dataplane import DataPlaneError, make_data_plane
from rlplane.runtime.groups import make_actor
from rlplane.runtime.process_actor import ProcessActor, RemoteTraceback


class Counter:
    """A worker: state kept across calls, a method that fails, one that returns its pid."""

    def __init__(self, start: int, data_plane=None):
        self.n = start
        self.dp = data_plane
        self.loaded: dict[str, torch.Tensor] = {}

    def add(self, k: int = 1) -> int:
        self.n += k
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def start_own_process(self) -> int:
        """A daemonic child of its own, as a verifier pool starts (refused inside a daemonic process)."""
        import multiprocessing

        p = multiprocessing.get_context("spawn").Process(target=os.getpid, daemon=True)
        p.start()
        p.join(timeout=60)
        return p.exitcode

    def gc_state(self) -> tuple[int, int]:
        """(objects frozen, objects the cyclic collector still tracks) in this process."""
        import gc

        return gc.get_freeze_count(), len(gc.get_objects())

    def fail(self, why: str) -> None:
        raise KeyError(why)

    def load(self, weights) -> float:
        """Copies the weights (as a generator's update_weights does); returns their sum."""
        self.loaded = {k: v.clone() for k, v in weights.items()}
        return float(sum(v.sum() for v in weights.values()))

    def weights_are_shared(self, weights) -> bool:
        return all(v.is_shared() for v in weights.values())

    def write(self, keys: list[str], rows: list[torch.Tensor]):
        self.dp.register_partition("train", ["input_ids", "reward"], num_samples=len(keys))
        return self.dp.put_samples(keys, "train", {"input_ids": rows, "reward": torch.arange(len(keys)).float()})

    def read(self, keys: list[str]) -> dict[str, torch.Tensor]:
        return self.dp.get_samples(keys, "train", ["input_ids", "reward"])

    def write_unknown_partition(self) -> None:
        self.dp.put_samples(["k"], "nowhere", {"reward": torch.zeros(1)})


class Unbuildable:
    def __init__(self):
        raise ValueError("no model here")


def test_calls_run_in_a_child_process_and_keep_state():
    actor = ProcessActor(Counter, dict(start=10))
    try:
        assert actor.obj is None  # like a Ray actor: the object lives elsewhere
        assert actor.call(Counter.pid) != os.getpid()
        assert actor.call(Counter.add) == 11
        assert actor.call(Counter.add, k=5) == 16
        assert actor.lazy(Counter.add) == 17  # lazy is call, as for the thread version
        assert actor.call(Counter.start_own_process) == 0
    finally:
        actor.close()


def test_the_child_freezes_what_its_object_built_out_of_the_collectors_reach():
    # A full collection would otherwise walk the child's whole heap (imports, a model) every few thousand
    # allocations: ~190 ms a time in a collector process.
    actor = ProcessActor(Counter, dict(start=0))
    try:
        frozen, tracked = actor.call(Counter.gc_state)
        assert frozen > 10_000 and tracked < frozen / 10  # torch's import alone is tens of thousands of objects
    finally:
        actor.close()


def no_such_method(self):
    """A method the worker's class lacks."""


def test_an_error_is_raised_here_with_its_type_and_the_childs_traceback():
    actor = ProcessActor(Counter, dict(start=0))
    try:
        with pytest.raises(KeyError, match="no such prompt") as e:
            actor.call(Counter.fail, "no such prompt")
        cause = e.value.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "in fail" in cause.text and "raise KeyError(why)" in cause.text
        assert actor.call(Counter.add) == 1  # the actor survives a failed call
        with pytest.raises(AttributeError):
            actor.call(no_such_method)
    finally:
        actor.close()


def test_a_failing_constructor_raises_here_and_leaves_no_process():
    with pytest.raises(ValueError, match="no model here") as e:
        ProcessActor(Unbuildable, {})
    assert "Unbuildable" in e.value.__cause__.text or "__init__" in e.value.__cause__.text


def test_close_ends_the_process_and_later_calls_fail_clearly():
    actor = ProcessActor(Counter, dict(start=0))
    pid = actor.call(Counter.pid)
    actor.close()
    actor.close()  # idempotent
    assert not actor.process.is_alive() and actor.process.exitcode == 0
    assert not _alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        actor.call(Counter.add)


def test_a_killed_child_is_reported_not_hung_on():
    actor = ProcessActor(Counter, dict(start=0))
    try:
        os.kill(actor.call(Counter.pid), signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"Counter process died \(exit code -9\)"):
            actor.call(Counter.add)
    finally:
        actor.close()


def test_staged_tensors_cross_once_through_shared_memory():
    actor = ProcessActor(Counter, dict(start=0))
    try:
        w = {"a": torch.ones(3), "b": torch.full((2, 2), 2.0)}
        first = actor.share("weights", w)
        assert first.tensors is not None
        assert actor.call(Counter.load, first) == 3 + 8  # 3 ones + 4 twos
        w["a"] += 1  # the next refit's weights: same layout, copied into the same buffer
        second = actor.share("weights", w)
        assert second.tensors is None and second.uid == first.uid  # only the name crosses now
        assert actor.call(Counter.load, second) == 6 + 8
        assert actor.call(Counter.weights_are_shared, second)
        grown = actor.share("weights", {"a": torch.ones(5)})  # a new layout: a new buffer, sent again
        assert grown.tensors is not None and actor.call(Counter.load, grown) == 5
    finally:
        actor.close()


def test_make_actor_process_under_local_only():
    actor = make_actor("local", Counter, dict(start=1), process=True)
    try:
        assert isinstance(actor, ProcessActor) and actor.call(Counter.add) == 2
    finally:
        actor.close()
    local = make_actor("local", Counter, dict(start=1))
    assert local.obj is not None and local.share("w", {"a": torch.ones(1)})["a"].item() == 1.0


def test_the_child_writes_into_the_parents_memory_plane():
    """The memory plane is forwarded: the child's put lands in this process's index, its columns in
    shared memory (stored here without a copy); the child reads back what this process wrote."""
    plane = make_data_plane("memory")
    actor = ProcessActor(Counter, dict(start=0, data_plane=plane))
    try:
        long = 10_000  # 80 kB of int64 tokens: past SMALL_TENSOR_BYTES, so its handle crosses, not its bytes
        rows = [torch.arange(long), torch.tensor([4, 5])]
        meta = actor.call(Counter.write, ["k0", "k1"], rows)
        assert meta.seq_lens == (long, 2)
        got = plane.get_samples(meta, None, ["input_ids", "reward"])
        assert torch.equal(got["input_ids"][0], torch.arange(long)) and got["input_ids"][1, :3].tolist() == [4, 5, 0]
        assert got["reward"].tolist() == [0.0, 1.0]
        plan = plane.index.lookup("train", ["k0"], ["input_ids", "reward"]).parts
        assert plan["input_ids"][0][0].values.is_shared()  # the child's shared memory, mapped here
        assert not plan["reward"][0][0].values.is_shared()  # 8 bytes: sent by value
        plane.put_samples(["k0", "k1"], "train", {"reward": torch.tensor([7.0, 8.0])})  # written here
        assert actor.call(Counter.read, ["k1", "k0"])["reward"].tolist() == [8.0, 7.0]
        with pytest.raises(DataPlaneError, match="nowhere"):  # the index's error, as is
            actor.call(Counter.write_unknown_partition)
    finally:
        actor.close()
    # The columns outlive the child that wrote them.
    assert torch.equal(plane.get_samples(meta, None, ["input_ids"])["input_ids"][0], torch.arange(long))


PARENT = """
import sys, time
sys.path[:0] = {path!r}
from test_process_actor_child import Counter
from rlplane.runtime.process_actor import ProcessActor
actor = ProcessActor(Counter, dict(start=0))
print(actor.call(Counter.pid), flush=True)
actor.call(Counter.sleep, 600)  # the child is busy in a call (not reading its pipe) when this process is killed
"""


def test_the_child_does_not_outlive_a_sigkilled_parent(tmp_path):
    # The parent is a script of its own (killing the test process is not an option); it imports the
    # worker class from a module in tmp_path, as a user's script would.
    (tmp_path / "test_process_actor_child.py").write_text("import os\nclass Counter:\n"
                                                           "    def __init__(self, start): pass\n"
                                                           "    def pid(self): return os.getpid()\n"
                                                           "    def sleep(self, s): import time; time.sleep(s)\n")
    src = str(Path(__file__).resolve().parents[3] / "src")
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(path=[str(tmp_path), src])],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # into the sleeping call
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        t0 = time.monotonic()
        while _alive(child) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its SIGKILLed parent by 5 s"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
