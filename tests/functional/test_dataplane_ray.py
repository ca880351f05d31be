"""The Ray data plane across processes: actor consumers fetch their DP shard and write back; clearing
returns the object store to where it was; owner="store" keeps data after its producer is gone."""

import re
import time

import pytest
import torch

from rlplane.dataplane import (
    GLOBAL_PAD_KEY,
    ClearedKeyError,
    DataPlaneError,
    dp_shard_rows,
    make_data_plane,
    shard_meta_for_dp,
)
from rlplane.dataplane.ray_objects import RELEASE_GRACE_S

pytestmark = pytest.mark.ray


def plasma_usage():
    """(MiB, objects) in Ray's shared-memory object store, from the raylet's own summary."""
    import ray
    from ray._private.internal_api import memory_summary

    # This session's own cluster: with no address Ray refuses when other Ray instances run on the host.
    summary = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    m = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", summary)
    return int(m.group(1)), int(m.group(2))


def settled_usage():
    """The store's usage once what earlier puts' clients still hold for a while (RELEASE_GRACE_S) has gone."""
    time.sleep(RELEASE_GRACE_S + 0.3)
    return wait_for_usage(plasma_usage())


def wait_for_usage(target, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while plasma_usage() != target and time.monotonic() < deadline:
        time.sleep(0.05)
    return plasma_usage()


@pytest.fixture(scope="module")
def consumers(ray_session):
    """Two DP-rank actors, started once per module (a worker start costs seconds on 2 busy cores)."""
    ray = ray_session

    @ray.remote(num_cpus=0.5)
    class Consumer:
        """A DP rank: fetches its shard, writes `prev_logprobs` = 2 * generation logprobs back."""

        def step(self, client, meta):
            # `client` arrives pickled: a handle on the driver's store actor.
            cols = client.get_samples(meta, None, ["input_ids", "generation_logprobs"])
            T = meta.extra_info[GLOBAL_PAD_KEY]
            assert cols["input_ids"].shape == (len(meta), T)
            client.put_samples(meta, None, {"prev_logprobs": 2 * cols["generation_logprobs"]})
            return len(meta), int(cols["input_ids"].shape[1])

        def rewrite(self, client, pid, keys, reward):
            client.put_samples(keys, pid, {"reward": torch.full((len(keys),), reward)})

        def clear(self, client, meta):
            client.clear_samples(meta, None)

        def produce(self, client):
            return client.put_samples(["a", "b"], "roll", {"input_ids": [torch.arange(3), torch.arange(200_000)]})

        def put_pair(self, client, pid):
            return client.put_samples(["a", "b"], pid, {"input_ids": [torch.arange(3), torch.arange(5)]})

        def read(self, client, meta):
            return int(client.get_samples(meta, None, ["input_ids"])["input_ids"].shape[0])

        def memory_store_size(self):
            import ray

            return ray._private.worker.global_worker.core_worker.get_memory_store_size()

    actors = [Consumer.remote() for _ in range(2)]
    yield actors
    for a in actors:
        ray.kill(a)  # (killing one twice is harmless)


def test_two_actor_consumers_fetch_shards_and_write_back(ray_session, consumers):
    ray = ray_session
    client = make_data_plane("ray")
    try:
        n = 64
        g = torch.Generator().manual_seed(0)
        lens = torch.randint(50, 3000, (n,), generator=g).tolist()
        keys = [f"p{i // 4}_g{i % 4}" for i in range(n)]
        gen_lp = [-torch.rand(L, generator=g) for L in lens]
        client.register_partition("train", ["input_ids", "generation_logprobs", "reward", "prev_logprobs"], n)
        before = settled_usage()
        meta = client.put_samples(
            keys, "train",
            {"input_ids": [torch.randint(0, 50_000, (L,)) for L in lens], "generation_logprobs": gen_lp,
             "reward": torch.rand(n)},
        )
        assert plasma_usage()[1] == before[1] + 1  # one object per put (all its columns), never per sample
        metas, inverse = shard_meta_for_dp(meta, 2)
        sizes = ray.get([c.step.remote(client, m) for c, m in zip(consumers, metas)])
        assert [s for s, _ in sizes] == [len(m) for m in metas] and sizes[0][1] == sizes[1][1]

        out = client.get_samples(meta, None, ["prev_logprobs"])["prev_logprobs"]  # (n, T)
        for i, L in enumerate(lens):
            torch.testing.assert_close(out[i, :L], 2 * gen_lp[i])
            assert (out[i, L:] == 0).all()
        # The same rows gathered rank by rank and put back with the inverse permutation.
        per_rank = [client.get_samples(m, None, ["reward"])["reward"] for m in metas]
        torch.testing.assert_close(torch.cat(per_rank)[inverse], client.get_samples(meta, None, ["reward"])["reward"])

        assert client.clear_samples(None, "train") == n
        assert client.num_objects() == 0
        assert wait_for_usage(before) == before  # every column object freed
    finally:
        client.close()


def test_a_put_split_by_dp_shards_makes_each_rank_fetch_only_its_object(ray_session, consumers):
    """put_samples(shards=dp_shard_rows(...)): one object per rank, and a rank's read fetches only its
    own (on a cluster of machines, only its bytes cross the network); the write-back still works."""
    ray = ray_session
    client = make_data_plane("ray")
    try:
        lens = [5, 300, 40, 7, 120, 3]
        keys = [f"k{i}" for i in range(6)]
        client.register_partition("split", ["input_ids", "generation_logprobs", "prev_logprobs"], 6)
        before = settled_usage()
        gen_lp = [-torch.rand(L) for L in lens]
        meta = client.put_samples(keys, "split", {"input_ids": [torch.arange(L) for L in lens],
                                                  "generation_logprobs": gen_lp},
                                  shards=dp_shard_rows(lens, 2))
        stored = meta.locations[0].stored
        assert len(stored.refs) == 2 and plasma_usage()[1] == before[1] + 2  # one object per shard
        metas, inverse = shard_meta_for_dp(meta, 2)
        fetched = []
        real_get = ray.get
        try:  # which objects does a rank's read fetch? (the read here, in the driver, as a rank's would)
            def get(refs, *a, **k):
                if isinstance(refs, list):  # (the store's answers come one ref at a time)
                    fetched.append(refs)
                return real_get(refs, *a, **k)

            ray.get = get
            for r, m in enumerate(metas):
                out = client.get_samples(m, None, ["input_ids"])["input_ids"]
                assert fetched[-1] == [stored.refs[r]]  # only its own object
                assert [out[i, :3].tolist() for i in range(len(m))] == [[0, 1, 2]] * len(m)
        finally:
            ray.get = real_get
        ray.get([c.step.remote(client, m) for c, m in zip(consumers, metas)])
        out = client.get_samples(meta, None, ["prev_logprobs"])["prev_logprobs"]
        for i, L in enumerate(lens):
            torch.testing.assert_close(out[i, :L], 2 * gen_lp[i])
        client.clear_samples(meta, None)
        fetched.clear()  # (it holds refs too)
        del meta, metas, stored
        assert wait_for_usage(before) == before  # both parts and the write-backs freed
    finally:
        client.close()


def test_store_owned_data_outlives_its_producer(ray_session, consumers):
    ray = ray_session
    client = make_data_plane("ray", owner="store")
    try:
        client.register_partition("roll", ["input_ids"], 2)
        producer = consumers[1]
        meta = ray.get(producer.produce.remote(client))
        ray.kill(producer)  # the producer's process is gone; the store owns the data
        out = client.get_samples(meta, None, ["input_ids"])["input_ids"]
        assert out.shape == (2, 200_000) and out[0, :3].tolist() == [0, 1, 2]
    finally:
        client.close()


def test_reader_waits_for_a_commit_whose_data_is_still_on_its_way(ray_session):
    """A put commits first and attaches its object after (they overlap). Another process may ask
    in between (Ray orders calls per caller only): it must wait for the data, not fail or see None."""
    import threading

    from rlplane.dataplane.codec import pack_rows, to_wire
    from rlplane.dataplane.index import PENDING, PlaneIndex, WriteSpec
    from rlplane.dataplane.ray_objects import Stored

    ray = ray_session
    client = make_data_plane("ray")
    try:
        client.register_partition("p", ["input_ids"], 2)
        lens = torch.tensor([2, 3])
        chunks = client._index_call(PlaneIndex.commit, "p", ["a", "b"], {"input_ids": PENDING},
                                    WriteSpec({"input_ids": lens.numpy()}, None, False, None)).chunks
        ref = ray.put({"input_ids": to_wire(pack_rows([torch.arange(2), torch.arange(3)]))})
        late = threading.Timer(0.3, lambda: client.placement.actor.attach.remote("p", chunks, Stored((ref,), (0,))))
        late.start()
        t0 = time.monotonic()
        out = client.get_samples(["a", "b"], "p", ["input_ids"])["input_ids"]
        assert time.monotonic() - t0 >= 0.25  # it waited for the attach rather than failing
        assert out.tolist() == [[0, 1, 0], [0, 1, 2]]
    finally:
        client.close()


def test_a_put_whose_object_was_never_stored_fails_its_readers_clearly(ray_session):
    from rlplane.dataplane.index import PENDING, PlaneIndex, WriteSpec
    from rlplane.dataplane.ray_objects import Failed

    ray = ray_session
    client = make_data_plane("ray")
    try:
        client.register_partition("p", ["reward"], 1)
        chunks = client._index_call(PlaneIndex.commit, "p", ["a"], {"reward": PENDING},
                                    WriteSpec({}, None, False, None)).chunks
        ray.get(client.placement.actor.attach.remote("p", chunks, Failed("ObjectStoreFullError: full")))
        with pytest.raises(DataPlaneError, match=r"partition 'p': field 'reward' of keys \['a'\] "
                                                 r"was never stored \(ObjectStoreFullError"):
            client.get_samples(["a"], "p", ["reward"])
    finally:
        client.close()


def test_a_reader_given_a_receipt_skips_the_lookup_and_still_sees_later_overwrites(ray_session, consumers):
    ray = ray_session
    client = make_data_plane("ray")
    try:
        client.register_partition("r", ["input_ids", "reward"], 2)
        meta = client.put_samples(["a", "b"], "r", {"input_ids": [torch.arange(3), torch.arange(4)],
                                                    "reward": torch.tensor([1.0, 2.0])})
        assert len(meta.locations) == 1 and meta.locations[0].stored is not None
        lookups = []
        lookup = client._lookup
        client._lookup = lambda *args: (lookups.append(args), lookup(*args))[1]
        out = client.get_samples(meta, None, ["input_ids", "reward"])
        assert lookups == []  # read straight from the receipt's object; the store only verified it
        assert out["input_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3]] and out["reward"].tolist() == [1.0, 2.0]
        # Another process overwrites b's reward. This process's receipt is now stale (and, written
        # elsewhere, still holds its ref): the read must notice and return the new value.
        ray.get(consumers[0].rewrite.remote(client, "r", ["b"], 9.0))
        assert client.get_samples(meta, None, ["reward"])["reward"].tolist() == [1.0, 9.0]
        assert len(lookups) == 1
        # A write-back's receipt carries both puts; the later one wins for the keys both hold.
        meta2 = client.put_samples(meta.slice(1), None, {"reward": torch.tensor([5.0])})
        assert len(meta2.locations) == 2
        assert client.get_samples(meta2, None, ["input_ids", "reward"])["reward"].tolist() == [5.0]
        assert len(lookups) == 1
    finally:
        client.close()


def test_puts_leave_no_entry_behind_in_their_owners_in_process_store(ray_session, consumers):
    """Ray keeps an entry per object for good in the owner's in-process store when the owner lets go of the object
    before a borrower does (the collector's puts, whose metas the driver holds; the driver's, read by a worker):
    one a step, the Ray actors' memory creep. A client holds what it put past its borrowers."""
    import gc

    ray = ray_session
    client = make_data_plane("ray")
    driver_store = ray._private.worker.global_worker.core_worker.get_memory_store_size
    producer = reader = consumers[0]  # (test_store_owned_data_outlives_its_producer kills the other)
    try:
        def one_round(i):
            client.register_partition(f"own{i}", ["input_ids"], 2)
            client.num_objects(f"own{i}")  # a call after the registration's send: the store has taken it
            meta = ray.get(producer.put_pair.remote(client, f"own{i}"))  # owned by the actor, borrowed here
            assert client.get_samples(meta, None, ["input_ids"])["input_ids"].shape[0] == 2
            client.clear_samples(meta, None)
            client.register_partition(f"mine{i}", ["input_ids"], 2)
            meta = client.put_samples(["c", "d"], f"mine{i}", {"input_ids": [torch.arange(4), torch.arange(5)]})
            assert ray.get(reader.read.remote(client, meta)) == 2  # owned here, borrowed by the reader
            client.clear_samples(meta, None)

        one_round(0)  # whatever a client sets up once
        time.sleep(RELEASE_GRACE_S + 0.5)
        gc.collect()
        before = ray.get(producer.memory_store_size.remote()), driver_store()
        for i in range(1, 41):
            one_round(i)
        time.sleep(RELEASE_GRACE_S + 0.5)
        gc.collect()
        after = ray.get(producer.memory_store_size.remote()), driver_store()
        # Before the hold: +40 entries in each (one per put); with it, what remains is a put's own, if any.
        assert after[0] <= before[0] + 2 and after[1] <= before[1] + 2, (before, after)
    finally:
        client.close()


def test_receipts_after_a_clear_refuse_to_read_and_free_the_store(ray_session, consumers):
    import gc

    ray = ray_session
    client = make_data_plane("ray")
    try:
        client.register_partition("c", ["input_ids"], 2)
        before = settled_usage()
        meta = client.put_samples(["a", "b"], "c", {"input_ids": [torch.arange(300_000), torch.arange(5)]})
        # Cleared here: the receipt ends at once and its ref goes RELEASE_GRACE_S later, so the store goes back
        # while the meta lives.
        client.clear_samples(meta, None, wait=False)
        assert wait_for_usage(before) == before
        with pytest.raises(ClearedKeyError, match=r"keys \['a', 'b'\] were cleared"):
            client.get_samples(meta, None, ["input_ids"])

        # Overwritten whole here: the old object goes although the old receipt lives on.
        meta = client.put_samples(["x", "y"], "c", {"input_ids": [torch.arange(300_000), torch.arange(5)]})
        after_one_put = wait_for_usage(plasma_usage())
        old_meta = meta
        meta = client.put_samples(["x", "y"], "c", {"input_ids": [torch.arange(300_000), torch.arange(5)]})
        assert wait_for_usage(after_one_put) == after_one_put and old_meta.locations[0].stored is None
        del old_meta
        # Cleared by another process: this process's receipt still holds its ref, yet the read refuses.
        ray.get(consumers[0].clear.remote(client, meta))
        with pytest.raises(ClearedKeyError, match=r"keys \['x', 'y'\] were cleared"):
            client.get_samples(meta, None, ["input_ids"])
        del meta  # ... and the object goes with the last meta that carries it
        gc.collect()
        assert wait_for_usage(before) == before
    finally:
        client.close()
