"""The Ray data plane with the index in the driver (`make_data_plane("ray", index="driver")`):
actor DP ranks read what the meta they are sent locates (`client.located`), with no index to ask,
and hand their write-backs back in receipts that the driver's index takes (`client.commit_receipts`, which
returns the results with each receipt replaced by the taken one; a worker group makes both calls,
runtime/groups.py)."""

import time

import pytest
import torch

from rlplane.dataplane import (
    ClearedKeyError,
    DataPlaneError,
    MissingFieldError,
    dp_shard_rows,
    make_data_plane,
    shard_meta_for_dp,
)

from .test_dataplane_ray import plasma_usage, wait_for_usage

pytestmark = pytest.mark.ray


def settled_usage(timeout_s=15.0):
    """Object-store usage once what earlier tests left behind is gone (objects a killed store actor
    borrowed go when Ray notices its death, seconds later): unchanged for a second."""
    import gc

    gc.collect()
    deadline = time.monotonic() + timeout_s
    last, since = plasma_usage(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 1.0:
        time.sleep(0.1)
        now = plasma_usage()
        if now != last:
            last, since = now, time.monotonic()
    return last


@pytest.fixture(scope="module")
def ranks(ray_session):
    """Two DP-rank actors, started once per module."""
    ray = ray_session

    @ray.remote(num_cpus=0.5)
    class Rank:
        def step(self, client, meta):
            """Fetch the shard, write prev_logprobs = 2 * generation logprobs back, return the receipt."""
            cols = client.get_samples(meta, None, ["input_ids", "generation_logprobs"])
            return client.put_samples(meta, None, {"prev_logprobs": 2 * cols["generation_logprobs"]})

        def read(self, client, meta, fields):
            """(error class name, message) of the read, or ("ok", the columns as lists)."""
            try:
                return "ok", {f: v.tolist() for f, v in client.get_samples(meta, None, fields).items()}
            except DataPlaneError as err:
                return type(err).__name__, str(err)

        def fetched_refs(self, client, meta, fields):
            """The objects this rank's read of `fields` would fetch."""
            plan = client._worker_plan(meta, list(meta.sample_ids), fields)
            return sorted({ref.hex() for parts in plan.values() for stored, _, rows, pos in parts
                           for ref, _, _ in stored.locate(rows, pos)})

        def write(self, client, meta, fields):
            return client.put_samples(meta, None, fields)

        def call(self, client, method, *args):
            try:
                getattr(client, method)(*args)
                return "ok"
            except DataPlaneError as err:
                return str(err)

    actors = [Rank.remote() for _ in range(2)]
    yield actors
    for a in actors:
        ray.kill(a)


def _batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(50, 3000, (n,), generator=g).tolist()
    return lens, {"input_ids": [torch.randint(0, 50_000, (L,), generator=g) for L in lens],
                  "generation_logprobs": [-torch.rand(L, generator=g) for L in lens]}


def test_ranks_read_and_write_back_through_the_drivers_index(ray_session, ranks):
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        n = 64
        lens, cols = _batch(n)
        client.register_partition("train", ["input_ids", "generation_logprobs", "prev_logprobs"], n)
        before = settled_usage()
        meta = client.put_samples([f"k{i}" for i in range(n)], "train", cols)
        assert plasma_usage()[1] == before[1] + 1  # one object per put
        metas, inverse = shard_meta_for_dp(meta, 2)
        written = client.commit_receipts(ray.get([r.step.remote(client, client.located(m))
                                                  for r, m in zip(ranks, metas)]))
        # The receipts reached the driver: its index now knows prev_logprobs for every key.
        assert client.status("train", fields=["prev_logprobs"]) == {f"k{i}": {"prev_logprobs": True} for i in range(n)}
        for w in written:
            client.prefetch(w)
        by_receipt = client.get_samples(written[0].concat(written[1]), None, ["prev_logprobs"])["prev_logprobs"]
        by_key = client.get_samples(list(meta.sample_ids), "train", ["prev_logprobs"])["prev_logprobs"]
        torch.testing.assert_close(by_receipt[inverse], by_key)
        for i, L in enumerate(lens):
            torch.testing.assert_close(by_key[i, :L], 2 * cols["generation_logprobs"][i])
            assert (by_key[i, L:] == 0).all()
        assert client.clear_samples(None, "train", wait=False) == n
        assert client.num_objects() == 0
        del meta, metas, written
        assert wait_for_usage(before) == before  # the put and both ranks' write-backs freed
    finally:
        client.close()


def test_a_put_split_by_dp_shards_makes_each_rank_fetch_only_its_object(ray_session, ranks):
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        lens = [5, 300, 40, 7, 120, 3]
        client.register_partition("split", ["input_ids", "generation_logprobs"], 6)
        meta = client.put_samples([f"k{i}" for i in range(6)], "split",
                                  {"input_ids": [torch.arange(L) for L in lens],
                                   "generation_logprobs": [-torch.rand(L) for L in lens]},
                                  shards=dp_shard_rows(lens, 2))
        refs = meta.locations[0].stored.refs
        assert len(refs) == 2
        metas, _ = shard_meta_for_dp(meta, 2)
        fetched = ray.get([r.fetched_refs.remote(client, client.located(m), ["input_ids"])
                           for r, m in zip(ranks, metas)])
        assert fetched == [[refs[0].hex()], [refs[1].hex()]]
    finally:
        client.close()


def test_a_meta_sent_after_the_driver_writes_reads_what_is_there_then(ray_session, ranks):
    """A located meta carries where its keys are at that moment: an overwrite or a field written by
    key list before it is located is read; a clear before it is located raises, saying so."""
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("r", ["input_ids", "reward", "advantages"], 2)
        meta = client.put_samples(["a", "b"], "r", {"input_ids": [torch.arange(3), torch.arange(4)],
                                                    "reward": torch.tensor([1.0, 2.0])})
        client.put_samples(["b"], "r", {"reward": torch.tensor([9.0])})  # this receipt is dropped
        client.put_samples(["a", "b"], "r", {"advantages": torch.tensor([0.5, -0.5])})
        assert ray.get(ranks[0].read.remote(client, client.located(meta), ["reward", "advantages"])) == (
            "ok", {"reward": [1.0, 9.0], "advantages": [0.5, -0.5]})
        client.clear_samples(["b"], "r")
        name, msg = ray.get(ranks[0].read.remote(client, client.located(meta), ["reward"]))
        assert name == "ClearedKeyError" and "keys ['b'] were cleared" in msg and "before it sent this meta" in msg
        # Rows of the meta that are still live read as before.
        first = client.located(meta.slice(0, 1))
        assert ray.get(ranks[0].read.remote(client, first, ["reward"])) == ("ok", {"reward": [1.0]})
        # What the meta does not locate (written after it was sent, or never) is named, not guessed.
        name, msg = ray.get(ranks[0].read.remote(client, first, ["input_ids", "nope"]))
        assert name == "MissingFieldError" and "field 'nope' of keys ['a'] is not in the locations" in msg
    finally:
        client.close()


def test_a_worker_write_the_index_refuses_is_raised_by_the_drivers_next_call(ray_session, ranks):
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("w", ["reward"], 2)
        meta = client.put_samples(["a", "b"], "w", {"reward": torch.tensor([1.0, 2.0])})
        client.commit_receipts(ray.get(ranks[0].write.remote(client, meta, {"bogus": torch.zeros(2)})))  # unregistered
        with pytest.raises(MissingFieldError, match=r"fields \['bogus'\] are not registered.*refused when its "
                                                    r"receipt reached the driver"):
            client.list_samples("w")
        assert client.list_samples("w") == ["a", "b"]  # said once; the index is as before
        assert client.status("w") == {"a": {"reward": True}, "b": {"reward": True}}
    finally:
        client.close()


def test_a_worker_asks_the_index_nothing(ray_session, ranks):
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("q", ["reward"], 1)
        client.put_samples(["a"], "q", {"reward": torch.tensor([1.0])})
        msg = ray.get(ranks[0].call.remote(client, "get_samples", ["a"], "q", ["reward"]))
        assert "a worker reads by a meta the driver sent it, not by a list of keys (['a'])" in msg
        msg = ray.get(ranks[0].call.remote(client, "clear_samples", ["a"], "q"))
        assert "the 'clear' request is answered by the driver only" in msg and "\n" not in msg
    finally:
        client.close()


def test_a_write_back_fetched_twice_is_taken_into_the_index_once(ray_session, ranks):
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("t", ["input_ids", "generation_logprobs", "prev_logprobs"], 4)
        _, cols = _batch(4)
        meta = client.put_samples(["a", "b", "c", "d"], "t", cols)
        ref = ranks[0].step.remote(client, client.located(meta))
        first, again = client.commit_receipts([ray.get(ref), ray.get(ref)])  # two copies of one receipt
        assert client.num_objects() == 3  # input_ids, generation_logprobs, prev_logprobs: not 4
        lookups = []
        lookup = client._lookup
        client._lookup = lambda *args: (lookups.append(args), lookup(*args))[1]
        client.get_samples(first, None, ["prev_logprobs"])
        client.get_samples(again, None, ["prev_logprobs"])
        assert lookups == []  # both receipts still current: the second arrival did not re-commit
    finally:
        client.close()


def test_the_driver_index_refuses_the_store_actors_options(ray_session):
    with pytest.raises(DataPlaneError, match=r"index = 'driver' takes no \['owner'\]"):
        make_data_plane("ray", index="driver", owner="store")
    with pytest.raises(DataPlaneError, match=r"index = 'nearby': choose 'store' or 'driver'"):
        make_data_plane("ray", index="nearby")


def test_clear_of_a_partition_frees_the_objects_its_worker_receipts_held(ray_session, ranks):
    """A key cleared in the driver after a rank's write-back: reading the write-back raises."""
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("c", ["input_ids", "generation_logprobs", "prev_logprobs"], 4)
        _, cols = _batch(4, seed=1)
        meta = client.put_samples(["a", "b", "c", "d"], "c", cols)
        written = client.commit_receipts(ray.get(ranks[1].step.remote(client, client.located(meta))))
        client.clear_samples(meta, None)
        with pytest.raises(ClearedKeyError, match=r"keys \['a', 'b', 'c', 'd'\] were cleared"):
            client.get_samples(written, None, ["prev_logprobs"])
        assert client.num_objects() == 0
    finally:
        client.close()


def test_a_located_meta_carries_one_snapshot_of_its_own_keys(ray_session, ranks):
    """Each rank's meta carries where its own rows are (not the whole put's keys, not once per
    receipt), and a meta rebuilt by `meta_for` reads in a worker too."""
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("o", ["input_ids", "reward"], 4)
        meta = client.put_samples(["a", "b", "c", "d"], "o", {"input_ids": [torch.arange(i + 1) for i in range(4)]})
        meta = client.put_samples(meta, None, {"reward": torch.tensor([1.0, 2.0, 3.0, 4.0])})
        assert len(meta.locations) == 2  # two receipts in the driver ...
        sent = client.located(meta.slice(2))
        assert [type(loc).__name__ for loc in sent.locations] == ["Snapshot"] and sent.locations[0].ids == ("c", "d")
        rebuilt = client.located(client.meta_for("o", ["d", "a"]))
        assert ray.get(ranks[0].read.remote(client, rebuilt, ["input_ids", "reward"])) == (
            "ok", {"input_ids": [[0, 1, 2, 3], [0, 0, 0, 0]], "reward": [4.0, 1.0]})
    finally:
        client.close()


def test_a_write_back_goes_home_without_the_snapshot_it_was_handed(ray_session, ranks):
    """A worker's receipt carries its own put, not the snapshot (back in the driver the index knows
    better, and its refs would cost a borrow round trip): a second worker reads it once located again."""
    ray = ray_session
    client = make_data_plane("ray", index="driver")
    try:
        client.register_partition("h", ["input_ids", "generation_logprobs", "prev_logprobs"], 2)
        _, cols = _batch(2, seed=2)
        meta = client.put_samples(["a", "b"], "h", cols)
        assert ray.get(ranks[1].read.remote(client, client.located(meta), ["generation_logprobs"]))[0] == "ok"
        written = ray.get(ranks[0].step.remote(client, client.located(meta)))
        assert [type(loc).__name__ for loc in written.locations] == ["Receipt"]
        written = client.commit_receipts(written)
        name, msg = ray.get(ranks[1].read.remote(client, written, ["generation_logprobs"]))
        assert name == "MissingFieldError" and "send the meta after the write" in msg  # only its own put
        name, cols_back = ray.get(ranks[1].read.remote(client, client.located(written),
                                                       ["prev_logprobs", "generation_logprobs"]))
        assert name == "ok" and len(cols_back["prev_logprobs"]) == 2
    finally:
        client.close()
