"""The prompt loader: fixed-size batches, seeded shuffling across epochs, exact resume."""

import pickle

import pytest

from rlplane.data import ArithmeticDataset, DatasetError, PromptDataLoader
from rlplane.models import build_char_tokenizer


@pytest.fixture(scope="module")
def dataset():
    return ArithmeticDataset(build_char_tokenizer(), num_problems=50, seed=0)


def _idx(batch):
    return [d.idx for d in batch]


def test_batches_and_epochs(dataset):
    loader = PromptDataLoader(dataset, 8, seed=1)
    assert len(loader) == 6  # 50 // 8; the last 2 prompts of each epoch are dropped
    epoch0 = [_idx(next(loader)) for _ in range(6)]
    assert all(len(b) == 8 for b in epoch0)
    assert len({i for b in epoch0 for i in b}) == 48  # no repeats within an epoch
    epoch1 = [_idx(next(loader)) for _ in range(6)]
    assert loader.epoch == 1 and epoch1 != epoch0  # a new permutation each epoch
    # Each datum carries the epoch that drew it (it seeds the prompt's samples: rollout.sample_keys).
    assert {d.epoch for d in next(PromptDataLoader(dataset, 8, seed=1))} == {0}
    loader.batches_done_in_epoch = len(loader)
    assert {d.epoch for d in next(loader)} == {2}


def test_seeded_and_unshuffled(dataset):
    a = [_idx(next(PromptDataLoader(dataset, 8, seed=1))) for _ in range(2)]
    b = _idx(next(PromptDataLoader(dataset, 8, seed=2)))
    assert a[0] == a[1] and a[0] != b
    assert _idx(next(PromptDataLoader(dataset, 8, shuffle=False))) == list(range(8))


@pytest.mark.parametrize("stop_after", [0, 1, 5, 6, 7, 13])
def test_resume_mid_epoch_gives_the_same_remaining_batches(dataset, stop_after):
    reference = PromptDataLoader(dataset, 8, seed=1)
    expected = [_idx(next(reference)) for _ in range(20)]  # more than 3 epochs
    first = PromptDataLoader(dataset, 8, seed=1)
    seen = [_idx(next(first)) for _ in range(stop_after)]
    state = pickle.loads(pickle.dumps(first.state_dict()))  # as a checkpoint would store it
    resumed = PromptDataLoader(dataset, 8, seed=1)
    resumed.load_state_dict(state)
    assert seen + [_idx(next(resumed)) for _ in range(20 - stop_after)] == expected


def test_errors(dataset):
    with pytest.raises(DatasetError, match="fewer than num_prompts_per_step = 64"):
        PromptDataLoader(dataset, 64)
    loader = PromptDataLoader(dataset, 8, seed=1)
    with pytest.raises(DatasetError, match="saved with seed 3"):
        loader.load_state_dict({"epoch": 0, "batches_done_in_epoch": 1, "seed": 3})
