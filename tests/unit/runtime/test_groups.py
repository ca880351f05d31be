"""Worker groups carry the data plane's seam: a Ray group sends each rank its shard located (where its
keys are, for ranks that cannot ask a driver-held index) and hands the ranks' write receipts to the
driver's index before `run_sharded` returns. Nothing happens when a receipt is pickled."""

import pickle

import pytest
import torch

from rlplane.dataplane import make_data_plane
from rlplane.runtime.groups import LocalGroup, RayGroup


class Doubler:
    """A DP rank: reads `x` of its shard, writes `y = 2x` back, returns the receipt."""

    def __init__(self, data_plane):
        self.dp = data_plane

    def ping(self):
        return True

    def double(self, meta):
        x = self.dp.get_samples(meta, None, ["x"])["x"]
        return self.dp.put_samples(meta, None, {"y": 2 * x})


def _put(client, n=6):
    client.register_partition("g", ["x", "y"], n)
    return client.put_samples([f"k{i}" for i in range(n)], "g", {"x": torch.arange(n, dtype=torch.float32)},
                              seq_lens=[3] * n)  # (lengths drive the DP sharding)


def test_a_local_group_writes_straight_into_the_shared_plane():
    client = make_data_plane("memory")
    group = LocalGroup(Doubler, [dict(data_plane=client)] * 2)
    meta = _put(client)
    group.run_sharded(Doubler.double, meta)
    assert client.get_samples(meta, None, ["y"])["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


@pytest.mark.ray
@pytest.mark.parametrize("index", ["driver", "store"])
def test_run_sharded_returns_with_the_ranks_writes_in_the_drivers_index(ray_session, index):
    client = make_data_plane("ray", index=index)
    group = RayGroup(Doubler, [dict(data_plane=client)] * 2, num_cpus=0.25, data_plane=client)
    try:
        meta = _put(client)
        written = group.run_sharded(Doubler.double, meta)
        assert client.status("g", fields=["y"]) == {f"k{i}": {"y": True} for i in range(6)}
        assert client.get_samples(meta, None, ["y"])["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        assert sum(len(w) for w in written) == 6
    finally:
        group.close()
        client.close()


@pytest.mark.ray
def test_unpickling_a_workers_receipt_in_the_driver_commits_nothing(ray_session):
    """A pending write reaches the index only through `commit_receipts`, once however often it is handed in."""
    from rlplane.dataplane.ray_backend import RayDataPlane

    client = make_data_plane("ray", index="driver")
    try:
        meta = _put(client)
        worker = pickle.loads(pickle.dumps(client))  # the client a worker gets
        assert type(worker) is RayDataPlane and worker.placement.key == client.placement.key
        receipt = worker.put_samples(meta, None, {"y": torch.ones(6)})
        arrived = pickle.loads(pickle.dumps(receipt))
        assert client.status("g", fields=["y"])["k0"] == {"y": False}
        client.commit_receipts([arrived, pickle.loads(pickle.dumps(receipt))])
        assert client.status("g", fields=["y"])["k0"] == {"y": True}
        assert client.num_objects() == 2  # x and y: the second copy was not committed again
    finally:
        client.close()
