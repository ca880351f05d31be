"""KVBatchMeta: every pure metadata operation keeps ids, lengths and tags aligned."""

import dataclasses

import pytest
import torch

from rlplane.dataplane import (
    DataPlaneError,
    DuplicateKeyError,
    KVBatchMeta,
    MissingKeyError,
    concat_metas,
    shard_meta_for_dp,
)
from rlplane.dataplane.index import PENDING, PlaneIndex, WriteSpec

NO_SPEC = WriteSpec({}, None, False, None)  # a commit that states no lengths or tags

def make(ids=("a", "b", "c", "d"), pid="train", lens=(3, 5, 2, 7), **kw):
    tags = kw.pop("tags", tuple({"r": i} for i in range(len(ids))))
    return KVBatchMeta(pid, "task", tuple(ids), ("input_ids", "reward"), lens, tags, kw.pop("extra_info", {"x": 1}))


def test_defaults_and_normalisation():
    m = KVBatchMeta("p", None, ["a", "b"], ["f"], [1, 2])
    assert m.sample_ids == ("a", "b") and m.fields == ("f",) and m.seq_lens == (1, 2)
    assert m.tags == ({}, {}) and m.extra_info == {} and len(m) == 2


def test_construction_errors():
    with pytest.raises(DuplicateKeyError, match="'a'"):
        KVBatchMeta("p", None, ("a", "a"))
    with pytest.raises(DataPlaneError, match="seq_lens has 1 entries for 2 keys"):
        KVBatchMeta("p", None, ("a", "b"), seq_lens=(1,))
    with pytest.raises(DataPlaneError, match="1 tags for 2 keys"):
        KVBatchMeta("p", None, ("a", "b"), tags=({},))


def test_subset_reorders_everything_together():
    m = make().subset([3, 0])
    assert m.sample_ids == ("d", "a") and m.seq_lens == (7, 3) and m.tags == ({"r": 3}, {"r": 0})
    assert m.fields == ("input_ids", "reward") and m.extra_info == {"x": 1} and m.task_name == "task"
    mask = make().subset(torch.tensor([True, False, True, False]))
    assert mask.sample_ids == ("a", "c")
    with pytest.raises(DataPlaneError, match="out of range"):
        make().subset([4])


def test_slice():
    m = make().slice(1, 3)
    assert m.sample_ids == ("b", "c") and m.seq_lens == (5, 2) and m.tags == ({"r": 1}, {"r": 2})
    assert make().slice(2).sample_ids == ("c", "d")


def test_drop():
    m = make().drop(["b", "d"])
    assert m.sample_ids == ("a", "c") and m.seq_lens == (3, 2) and m.tags == ({"r": 0}, {"r": 2})
    assert len(make().drop(["a", "b", "c", "d"])) == 0
    with pytest.raises(MissingKeyError, match="'zz'"):
        make().drop(["zz"])


def test_select_ids():
    assert make().select_ids(["c", "a"]).seq_lens == (2, 3)
    with pytest.raises(MissingKeyError):
        make().select_ids(["q"])


def test_concat():
    a, b = make(), make(ids=("e", "f"), lens=(1, 1), extra_info={"y": 2})
    for m in (a.concat(b), KVBatchMeta.concat(a, b), concat_metas([a, b])):
        assert m.sample_ids == ("a", "b", "c", "d", "e", "f")
        assert m.seq_lens == (3, 5, 2, 7, 1, 1)
        assert [t["r"] for t in m.tags] == [0, 1, 2, 3, 0, 1]
        assert m.extra_info == {"x": 1, "y": 2}
    no_lens = KVBatchMeta("train", None, ("z",), ("input_ids",))
    m = a.concat(no_lens)
    assert m.seq_lens is None and m.fields == ("input_ids",)  # only fields every meta promises
    with pytest.raises(DataPlaneError, match="different partitions"):
        a.concat(make(ids=("q",), lens=(1,), pid="val"))
    with pytest.raises(DuplicateKeyError, match="'a'"):
        a.concat(make(ids=("a",), lens=(1,)))
    with pytest.raises(DataPlaneError, match="zero metas"):
        concat_metas([])


def test_with_fields_and_extra_info():
    m = make().with_fields(["adv", "adv", "mask"])
    assert m.fields == ("adv", "mask") and m.sample_ids == make().sample_ids
    assert make().with_extra_info(z=3).extra_info == {"x": 1, "z": 3}


def test_stamp_tags_is_pure_and_aligned():
    base = make()
    m = base.stamp_tags({"std": torch.tensor([0.0, 1.0, 2.0, 3.0]), "baseline": [1, 1, 2, 2]})
    assert m.tags[2] == {"r": 2, "std": 2.0, "baseline": 2} and isinstance(m.tags[2]["std"], float)
    assert base.tags[2] == {"r": 2}  # the original is untouched
    m2 = m.subset([2, 1])
    assert m2.tag_values("std") == [2.0, 1.0]
    m3 = base.stamp_tags([{"k": i} for i in range(4)])
    assert m3.tag_values("k") == [0, 1, 2, 3]
    with pytest.raises(DataPlaneError, match="tag 'std' has 3 values for 4 rows"):
        base.stamp_tags({"std": [1, 2, 3]})
    with pytest.raises(DataPlaneError, match="2 tag dicts for 4 rows"):
        base.stamp_tags([{}, {}])
    with pytest.raises(DataPlaneError, match="tag 'nope' missing"):
        base.tag_values("nope")


def test_meta_pickles():
    import pickle

    m = make()
    assert pickle.loads(pickle.dumps(m)) == m


def test_index_attach_fills_a_pending_chunk_or_frees_a_released_one():
    import numpy as np

    ix = PlaneIndex()
    ix.register("p", ["x"], 2, None)
    first = ix.commit("p", ["a", "b"], {"x": PENDING}, NO_SPEC).chunks
    assert ix.lookup("p", ["a"], ["x"]).parts["x"][0][0] == PENDING
    ix.attach("p", first, {"x": "obj1"})
    assert ix.lookup("p", ["b"], ["x"]).parts["x"][0][0] == "obj1" and ix.freed == []
    # A chunk overwritten (or cleared) before its data arrives: the late data is freed at once.
    second = ix.commit("p", ["a", "b"], {"x": PENDING}, NO_SPEC).chunks
    ix.clear("p", None)
    ix.freed.clear()
    ix.attach("p", second, {"x": "obj2"})
    assert ix.freed == ["obj2"] and ix.num_chunks("p") == 0
    assert np.all(ix._parts["p"].seq_len == -1)


def test_index_verify_says_whether_receipt_chunks_are_still_current():
    import numpy as np

    from rlplane.dataplane import ClearedKeyError
    ix = PlaneIndex()
    ix.register("p", ["x", "y"], 2, None)
    chunks = ix.commit("p", ["a", "b"], {"x": "o1", "y": "o1"}, NO_SPEC).chunks
    promised = {"x": np.full(2, chunks["x"]), "y": np.full(2, chunks["y"])}
    assert ix.verify("p", ["a", "b"], promised)
    assert ix.verify("p", ["b"], {"x": np.full(1, chunks["x"])})  # a subset (one DP rank's keys)
    ix.commit("p", ["b"], {"x": "o2"}, NO_SPEC)  # b's x is overwritten: its receipt is stale
    assert not ix.verify("p", ["a", "b"], promised)
    assert ix.verify("p", ["a", "b"], {"y": promised["y"]})  # ... but not for y
    ix.clear("p", ["a"])
    with pytest.raises(ClearedKeyError, match=r"keys \['a'\] were cleared"):
        ix.verify("p", ["a"], {"y": np.full(1, chunks["y"])})



def test_index_locate_says_where_every_field_of_the_keys_is_now():
    """What a driver-held index ships with a meta: per field, the payloads and, per key, which
    payload (-1: none) and which row in it; and the error for keys that are not live."""
    from rlplane.dataplane import ClearedKeyError, UnknownPartitionError
    ix = PlaneIndex()
    ix.register("p", ["x", "y"], 3, None)
    ix.commit("p", ["a", "b", "c"], {"x": "o1"}, NO_SPEC)  # x of a, b, c: rows 0, 1, 2 of o1
    ix.commit("p", ["c", "b"], {"x": "o2", "y": "o2"}, NO_SPEC)  # c, b: rows 0, 1 of o2
    ix.clear("p", ["a"])
    where, gone = ix.locate("p", ["b", "a", "c"])
    payloads, which, rows = where["x"]
    assert payloads == ["o2"] and which.tolist() == [0, -1, 0] and rows.tolist() == [1, -1, 0]  # o1 went with a
    payloads, which, rows = where["y"]
    assert payloads == ["o2"] and which.tolist() == [0, -1, 0] and rows.tolist() == [1, -1, 0]
    assert isinstance(gone, ClearedKeyError) and "keys ['a'] were cleared" in str(gone)
    ix.commit("p", ["d"], {"x": "o3"}, NO_SPEC)
    where, gone = ix.locate("p", ["d", "b"])
    payloads, which, rows = where["x"]
    assert payloads == ["o2", "o3"] and which.tolist() == [1, 0] and rows.tolist() == [0, 1]
    assert where["y"][1].tolist() == [-1, 0] and gone is None  # d has no y: -1, and it is live
    where, gone = ix.locate("q", ["a"])
    assert where == {} and isinstance(gone, UnknownPartitionError)

def test_locations_survive_row_selection_and_concat_but_not_equality():
    a = make().with_fields(["f"])
    with_loc = dataclasses.replace(a, locations=("L1",))
    assert with_loc == a and "L1" not in repr(with_loc)  # a hint: not part of what a meta says
    assert with_loc.subset([1, 0]).locations == ("L1",)
    assert shard_meta_for_dp(with_loc, 2)[0][1].locations == ("L1",)
    b = KVBatchMeta("train", None, ("z",), locations=("L2",))
    assert concat_metas([with_loc, b]).locations == ("L1", "L2")
