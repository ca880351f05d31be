"""The key index stays O(live keys) however many steps pass: async GRPO never re-registers its
partition empty, so cleared keys must give back their slots and their tombstones must not pile up."""

import pytest
import torch

from rlplane.dataplane import ClearedKeyError, MissingKeyError, make_data_plane

LIVE = 64  # keys per step


def async_steps(client, pid, first, last):
    """Steps first..last-1 of an async-shaped workload: the next step's keys are written before this
    step's are cleared (LIVE to 2 * LIVE keys live at a time)."""
    for step in range(first, last):
        keys = [f"s{step + 1}_k{i}" for i in range(LIVE)]
        client.put_samples(keys, pid, {"reward": torch.rand(LIVE)}, tags=[{"step": step + 1}] * LIVE)
        client.clear_samples([f"s{step}_k{i}" for i in range(LIVE)], pid)


def start(client, pid):
    client.register_partition(pid, ["reward"], LIVE)
    client.put_samples([f"s0_k{i}" for i in range(LIVE)], pid, {"reward": torch.rand(LIVE)})


@pytest.fixture(params=["memory", pytest.param("ray", marks=pytest.mark.ray),
                        pytest.param("ray-driver", marks=pytest.mark.ray)])
def backend(request):
    if request.param.startswith("ray"):
        request.getfixturevalue("ray_session")
    c = make_data_plane("ray", index="driver") if request.param == "ray-driver" else make_data_plane(request.param)
    yield request.param, c
    c.close()


def test_slots_and_tombstones_stay_within_twice_the_live_keys(backend):
    name, client = backend
    steps = 10_000 if name == "memory" else 400  # the Ray ones: a round trip per call; flatness shows sooner
    start(client, "async")
    async_steps(client, "async", 0, 100)
    early = client.footprint("async")
    async_steps(client, "async", 100, steps)
    late = client.footprint("async")
    assert late["live_keys"] == LIVE
    assert late["slots"] <= 2 * LIVE and late["tombstones"] <= 2 * LIVE, late
    assert {k: late[k] for k in ("slots", "tombstones", "chunks")} == {k: early[k] for k in ("slots", "tombstones",
                                                                                              "chunks")}
    assert late["bytes"] <= early["bytes"] * 1.1  # flat (key strings grow a digit now and then)


def test_a_recently_cleared_key_is_still_refused_and_an_old_one_is_unknown(backend):
    _, client = backend
    start(client, "tomb")
    async_steps(client, "tomb", 0, 3)  # s0 cleared at step 0, its slots reused at step 1; s2 cleared at step 2
    with pytest.raises(ClearedKeyError, match=r"were cleared"):
        client.put_samples(["s2_k0"], "tomb", {"reward": torch.rand(1)})
    with pytest.raises(ClearedKeyError, match=r"were cleared"):
        client.get_samples(["s2_k1"], "tomb", ["reward"])
    with pytest.raises(MissingKeyError, match=r"are not stored"):  # its tombstone went with its slot
        client.get_samples(["s0_k1"], "tomb", ["reward"])
    assert client.list_samples("tomb") == [f"s3_k{i}" for i in range(LIVE)]
    out = client.get_samples([f"s3_k{i}" for i in range(LIVE)], "tomb", ["reward"])["reward"]
    assert out.shape == (LIVE,)


def test_a_reused_slot_starts_clean(backend):
    """A new key in a cleared key's slot has no fields, length or tags of the old one."""
    _, client = backend
    client.register_partition("clean", ["input_ids", "reward"], 2)
    client.put_samples(["a", "b"], "clean", {"input_ids": [torch.arange(3), torch.arange(5)],
                                             "reward": torch.tensor([1.0, 2.0])}, tags=[{"r": 1}, {"r": 2}])
    client.put_samples(["c"], "clean", {"reward": torch.tensor([3.0])})  # keeps the partition non-empty
    client.clear_samples(["a", "b"], "clean")
    meta = client.put_samples(["d", "e"], "clean", {"reward": torch.tensor([4.0, 5.0])})
    assert client.footprint("clean")["slots"] == 3
    assert meta.seq_lens is None and meta.tags == ({}, {})
    assert client.status("clean", ["d", "e"]) == {k: {"input_ids": False, "reward": True} for k in ("d", "e")}
    assert client.get_samples(["d", "e", "c"], "clean", ["reward"])["reward"].tolist() == [4.0, 5.0, 3.0]
