"""One behaviour suite run against every backend: the memory plane, its forwarding client (what a worker
in a child process holds) and the Ray plane, with its index in a store actor or in the driver, must agree."""

import itertools

import pytest
import torch

from rlplane.dataplane import (
    GLOBAL_PAD_KEY,
    ClearedKeyError,
    DataPlaneError,
    DuplicateKeyError,
    MissingFieldError,
    MissingKeyError,
    ShapeError,
    UnknownPartitionError,
    dp_shard_rows,
    make_data_plane,
    shard_meta_for_dp,
)

FIELDS = ["input_ids", "generation_logprobs", "token_mask", "reward", "prev_logprobs", "advantages", "emb"]
_pids = itertools.count()


@pytest.fixture(scope="module", params=["memory", "forwarding", pytest.param("ray", marks=pytest.mark.ray),
                                        pytest.param("ray-driver", marks=pytest.mark.ray)])
def client(request):
    if request.param == "forwarding":  # a memory plane's client for another process, used from this one
        import multiprocessing

        from rlplane.dataplane.forwarding import serve_to_other_process

        plane = make_data_plane("memory")
        c, server = serve_to_other_process(plane, multiprocessing.get_context("spawn"))
        c.index = plane.index  # where its columns are counted: the served plane's index
        yield c
        c.close()
        server.thread.join(timeout=5)
        assert not server.thread.is_alive()  # the server ends with its client's pipe
        return
    if request.param.startswith("ray"):
        request.getfixturevalue("ray_session")
    c = make_data_plane("ray", index="driver") if request.param == "ray-driver" else make_data_plane(request.param)
    yield c
    c.close()


@pytest.fixture
def pid(client):
    p = f"train{next(_pids)}"
    client.register_partition(p, FIELDS, num_samples=3, task_name="rollout")
    return p


def batch(lens=(3, 5, 2), seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 100, (L,), generator=g) for L in lens]
    return {
        "input_ids": ids,
        "generation_logprobs": [-torch.rand(L, generator=g) for L in lens],
        "token_mask": [torch.ones(L, dtype=torch.bool) for L in lens],
        "reward": torch.tensor([1.0, 0.0, 0.5][: len(lens)]),
    }


KEYS = ["p0_g0", "p0_g1", "p1_g0"]


def test_put_get_round_trip(client, pid):
    data = batch()
    meta = client.put_samples(KEYS, pid, data, tags=[{"i": i} for i in range(3)])
    assert meta.seq_lens == (3, 5, 2) and meta.task_name == "rollout"
    assert meta.fields == ("input_ids", "generation_logprobs", "token_mask", "reward")
    assert [t["i"] for t in meta.tags] == [0, 1, 2]
    out = client.get_samples(KEYS[::-1], pid, ["input_ids", "token_mask", "reward"], pad_values={"input_ids": -1})
    assert out["input_ids"].shape == (3, 5) and out["token_mask"].dtype == torch.bool
    for i, k in enumerate(KEYS[::-1]):
        j = KEYS.index(k)
        L = len(data["input_ids"][j])
        assert torch.equal(out["input_ids"][i, :L], data["input_ids"][j]) and (out["input_ids"][i, L:] == -1).all()
        assert out["token_mask"][i].sum() == L
    assert out["reward"].tolist() == [0.5, 0.0, 1.0]
    assert client.get_samples(KEYS, pid, ["input_ids"], pad_to=8)["input_ids"].shape == (3, 8)


def test_dense_multidim_and_jagged_nontoken_fields(client, pid):
    emb = torch.randn(3, 2, 4)
    client.put_samples(KEYS, pid, {"emb": emb})
    assert torch.equal(client.get_samples(KEYS, pid, ["emb"])["emb"], emb)
    client.register_partition(pid, ["prompt"], 3)
    client.put_samples(KEYS, pid, {"prompt": [torch.arange(n) for n in (1, 4, 2)]})
    assert client.get_samples(KEYS, pid, ["prompt"])["prompt"].shape == (3, 4)  # own longest row


def test_write_back_padded_is_trimmed_to_lengths(client, pid):
    meta = client.put_samples(KEYS, pid, batch())
    metas, inverse = shard_meta_for_dp(meta, 2)
    for m in metas:
        T = m.extra_info[GLOBAL_PAD_KEY]
        lp = torch.full((len(m), T), 9.0)  # padded (B, T); the tail beyond each length is padding
        m2 = client.put_samples(m, None, {"prev_logprobs": lp})
        assert m2.fields[-1] == "prev_logprobs" and m2.extra_info == m.extra_info
    out = client.get_samples(meta, None, ["prev_logprobs"])["prev_logprobs"]
    assert out.shape == (3, 5)
    assert out.sum(1).tolist() == [27.0, 45.0, 18.0]  # 9 * length: nothing beyond the length kept
    # also by key list (lengths come from the index)
    client.put_samples(KEYS, pid, {"advantages": torch.ones(3, 6)})
    assert client.get_samples(KEYS, pid, ["advantages"])["advantages"].sum().item() == 10


def test_overwrite_replaces_and_status_tracks_fields(client, pid):
    client.put_samples(KEYS[:2], pid, {"input_ids": [torch.arange(2), torch.arange(3)]})
    st = client.status(pid)
    assert st["p0_g0"]["input_ids"] and not st["p0_g0"]["reward"]
    assert client.status(pid, ["zz"], ["reward"]) == {"zz": {"reward": False}}
    assert client.ready_samples(pid, ["input_ids"]) == KEYS[:2]
    assert not client.is_complete(pid, ["input_ids"])
    client.put_samples(KEYS[2:], pid, {"input_ids": [torch.arange(4)]})
    assert client.is_complete(pid, ["input_ids"])
    client.put_samples(KEYS[:1], pid, {"reward": torch.tensor([1.0])})
    client.put_samples(KEYS[:1], pid, {"reward": torch.tensor([2.0])})
    assert client.get_samples(KEYS[:1], pid, ["reward"])["reward"].tolist() == [2.0]
    assert client.list_samples(pid) == KEYS
    m = client.meta_for(pid)
    assert m.sample_ids == tuple(KEYS) and m.fields == ("input_ids",) and m.seq_lens == (2, 3, 4)


def test_clear_and_step_lifecycle(client, pid):
    """A step as the recipes run it: first write, dynamic sampling's clear, a padded read, a write-back,
    the final clear."""
    keys = ["u0_g0", "u0_g1", "u1_g0", "u1_g1"]  # {prompt_uid}_g{i}, as the rollout worker mints them
    data = batch((3, 5, 2, 4))
    data["reward"] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    meta = client.put_samples(keys, pid, data, tags=[{"std": s} for s in (0.0, 0.0, 0.5, 0.5)])
    dropped = [k for k, t in zip(meta.sample_ids, meta.tags) if t["std"] == 0]  # dynamic sampling
    client.clear_samples(dropped, pid)
    meta = meta.subset([i for i, t in enumerate(meta.tags) if t["std"] != 0])
    assert meta.sample_ids == tuple(keys[2:]) and client.list_samples(pid) == keys[2:]
    cols = client.get_samples(meta, None, ["generation_logprobs", "token_mask"], pad_to=8)
    assert cols["generation_logprobs"].shape == (2, 8)  # padded to the requested global length
    meta = client.put_samples(meta, None, {"advantages": torch.zeros(2, 4)})
    client.clear_samples([keys[2]], pid)
    assert client.clear_samples(None, pid) == 1 and client.list_samples(pid) == []
    assert client.clear_samples(None, pid) == 0
    if hasattr(client, "index"):
        assert client.index.num_chunks(pid) == 0  # every column freed
    else:
        assert client.num_objects(pid) == 0


# ---- errors: each names the partition, the key(s) and the field ---------------------------------


def test_error_unknown_partition(client):
    with pytest.raises(UnknownPartitionError, match="partition 'nope' is not registered"):
        client.put_samples(KEYS, "nope", batch())
    with pytest.raises(UnknownPartitionError, match="'nope'"):
        client.get_samples(KEYS, "nope", ["reward"])


def test_error_missing_key(client, pid):
    client.put_samples(KEYS, pid, batch())
    with pytest.raises(MissingKeyError, match=rf"partition '{pid}': keys \['ghost'\] are not stored.*reward"):
        client.get_samples(["p0_g0", "ghost"], pid, ["reward"])


def test_error_missing_field(client, pid):
    client.put_samples(KEYS, pid, batch())
    client.put_samples(KEYS[:1], pid, {"advantages": [torch.ones(3)]})
    with pytest.raises(MissingFieldError, match=rf"partition '{pid}': field 'advantages' is "
                                                r"not written for keys \['p0_g1', 'p1_g0'\]"):
        client.get_samples(KEYS, pid, ["advantages"])
    with pytest.raises(MissingFieldError, match="field 'bogus'.*registered fields"):
        client.get_samples(KEYS, pid, ["bogus"])
    with pytest.raises(MissingFieldError, match="select_fields is empty"):
        client.get_samples(KEYS, pid, [])
    with pytest.raises(MissingFieldError, match=r"fields \['bogus'\] are not registered.*p0_g0"):
        client.put_samples(KEYS, pid, {"bogus": torch.ones(3)})


def test_error_duplicate_key_in_put(client, pid):
    with pytest.raises(DuplicateKeyError, match=rf"partition '{pid}': keys \['a'\] appear more than once.*reward"):
        client.put_samples(["a", "b", "a"], pid, {"reward": torch.ones(3)})
    assert client.list_samples(pid) == []  # nothing half-written


def test_error_tags_wrong_length(client, pid):
    with pytest.raises(DataPlaneError, match=rf"partition '{pid}': 2 tags for 3 keys \['p0_g0'.*reward"):
        client.put_samples(KEYS, pid, {"reward": torch.ones(3)}, tags=[{}, {}])


def test_error_first_dim_mismatch(client, pid):
    with pytest.raises(ShapeError, match=rf"partition '{pid}': field 'reward' has first dimension 2 for 3 keys"):
        client.put_samples(KEYS, pid, {"reward": torch.ones(2)})
    with pytest.raises(ShapeError, match="field 'input_ids' has 2 rows for 3 keys"):
        client.put_samples(KEYS, pid, {"input_ids": [torch.ones(2), torch.ones(2)]})
    assert client.list_samples(pid) == []


def test_error_token_field_longer_than_sequence(client, pid):
    client.put_samples(KEYS, pid, batch())  # lengths 3, 5, 2
    with pytest.raises(ShapeError, match=rf"partition '{pid}': per-token field 'advantages' is longer than the "
                                         r"sequence length for keys \['p1_g0'\].*3 > 2"):
        client.put_samples(KEYS, pid, {"advantages": [torch.ones(3), torch.ones(5), torch.ones(3)]})
    with pytest.raises(ShapeError, match="'generation_logprobs' is longer.*'new'"):  # same put as input_ids
        client.put_samples(["new"], pid, {"input_ids": [torch.ones(2)], "generation_logprobs": [torch.ones(3)]})
    with pytest.raises(ShapeError, match="already have sequence length"):
        client.put_samples(KEYS, pid, {"reward": torch.ones(3)}, seq_lens=[4, 5, 2])
    assert client.status(pid, KEYS, ["advantages"])["p0_g0"]["advantages"] is False  # atomic


def test_error_write_or_read_cleared_key(client, pid):
    client.put_samples(KEYS, pid, batch())
    client.clear_samples(KEYS[:1], pid)
    with pytest.raises(ClearedKeyError, match=rf"partition '{pid}': keys \['p0_g0'\] "
                                              r"were cleared; writing field 'reward'"):
        client.put_samples(KEYS[:1], pid, {"reward": torch.ones(1)})
    with pytest.raises(ClearedKeyError, match="were cleared; cannot get fields \\['reward'\\]"):
        client.get_samples(KEYS, pid, ["reward"])
    with pytest.raises(ClearedKeyError):
        client.clear_samples(KEYS[:1], pid)


def test_clear_without_waiting_reports_a_refusal_on_the_next_call(client, pid):
    client.put_samples(KEYS, pid, batch())
    client.clear_samples(KEYS[:1], pid, wait=False)
    assert client.list_samples(pid) == KEYS[1:]
    # Refused (already cleared): a remote store tells this client at its next call; memory at once.
    with pytest.raises(ClearedKeyError, match=r"keys \['p0_g0'\] were cleared"):
        client.clear_samples(KEYS[:1], pid, wait=False)
        client.list_samples(pid)
    assert client.list_samples(pid) == KEYS[1:]  # reported once; the client goes on working


@pytest.mark.parametrize(
    "rows",
    [
        [torch.ones(2), torch.ones(3, dtype=torch.int64)],  # dtypes (a cat would silently promote)
        [torch.ones(2), torch.ones(3, 2)],  # ranks
        [torch.ones(2, 4), torch.ones(3, 2)],  # trailing shapes
        [torch.tensor(1.0), torch.ones(3)],  # a scalar among rows
    ],
)
def test_error_rows_that_differ_in_more_than_length(client, pid, rows):
    with pytest.raises(ShapeError, match=rf"partition '{pid}': field 'emb' rows disagree.*\['a', 'b'\]"):
        client.put_samples(["a", "b"], pid, {"emb": rows})
    assert client.list_samples(pid) == []  # nothing half-written


def test_error_padded_token_field_without_lengths(client, pid):
    with pytest.raises(ShapeError, match="'prev_logprobs' is padded but keys.*no sequence length"):
        client.put_samples(["fresh"], pid, {"prev_logprobs": torch.ones(1, 4)})


def test_error_pad_to_too_short(client, pid):
    client.put_samples(KEYS, pid, batch())
    with pytest.raises(ShapeError, match="pad_to=4 is shorter than the longest per-token row \\(5\\)"):
        client.get_samples(KEYS, pid, ["input_ids"], pad_to=4)


def test_error_meta_partition_mismatch(client, pid):
    meta = client.put_samples(KEYS, pid, batch())
    with pytest.raises(DataPlaneError, match="given with a meta of partition"):
        client.get_samples(meta, "other", ["reward"])


def test_reregister_empty_partition_starts_afresh(client, pid):
    client.put_samples(KEYS, pid, batch())
    client.clear_samples(None, pid)
    client.register_partition(pid, FIELDS, 3)
    client.put_samples(KEYS, pid, batch())  # tombstones gone with the new step
    assert client.list_samples(pid) == KEYS


def test_a_put_split_by_shards_reads_back_in_the_callers_order(client, pid):
    """`shards=` stores each part apart (Ray) or only checks it (memory); either way the receipt and
    every read keep the caller's order, whole or shard by shard."""
    data = batch()
    meta = client.put_samples(KEYS, pid, data, tags=[{"t": 0}, {"t": 1}, {"t": 2}], shards=[[2, 0], [1]])
    assert meta.sample_ids == tuple(KEYS) and meta.seq_lens == (3, 5, 2) and [t["t"] for t in meta.tags] == [0, 1, 2]
    whole = client.get_samples(meta, None, ["input_ids", "reward"])
    assert whole["input_ids"][1].tolist() == data["input_ids"][1].tolist()
    assert whole["input_ids"][2, :2].tolist() == data["input_ids"][2].tolist()
    assert whole["reward"].tolist() == data["reward"].tolist()
    for rows in ([2, 0], [1], [1, 2]):  # a shard's own rows, and rows across both parts
        part = client.get_samples(meta.subset(rows), None, ["input_ids", "reward"])
        torch.testing.assert_close(part["reward"], data["reward"][rows])
        for i, r in enumerate(rows):
            L = len(data["input_ids"][r])
            assert part["input_ids"][i, :L].tolist() == data["input_ids"][r].tolist()


def test_shards_must_cover_every_row_once(client, pid):
    with pytest.raises(DataPlaneError, match=r"shards= lists 2 row indices for 3 keys; each row 0..2 must appear"):
        client.put_samples(KEYS, pid, batch(), shards=[[0], [2]])
    with pytest.raises(DataPlaneError, match=r"shards= lists 3 row indices for 3 keys"):
        client.put_samples(KEYS, pid, batch(), shards=[[0, 1], [1]])
    assert client.list_samples(pid) == []  # nothing was written


def test_dp_shard_rows_is_the_split_shard_meta_for_dp_makes(client, pid):
    lens = [7, 1, 4, 4, 2, 9]
    keys = [f"k{i}" for i in range(6)]
    meta = client.put_samples(keys, pid, {"input_ids": [torch.zeros(L, dtype=torch.long) for L in lens]})
    for dp, bs in [(2, None), (3, None), (2, 6)]:
        metas, _ = shard_meta_for_dp(meta, dp, bs)
        assert [list(m.sample_ids) for m in metas] == [[keys[i] for i in rows] for rows in dp_shard_rows(lens, dp, bs)]
    with pytest.raises(DataPlaneError, match="dp_shard_rows: dp_world = 0"):
        dp_shard_rows(lens, 0)
