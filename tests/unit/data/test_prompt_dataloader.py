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


@pytest.fixture(scope="module")
def dataset24():
    return ArithmeticDataset(build_char_tokenizer(), num_problems=24, seed=0)


def _draws(loader, steps):
    return [(d.epoch, d.idx) for _ in range(steps) for d in next(loader)]


@pytest.mark.parametrize("new_size", [3, 8])
def test_resume_at_another_batch_size_continues_at_the_next_draw(dataset24, new_size):
    # 24 prompts, 2 steps of 4 (positions 0..7 of epoch 0's permutation), resumed at new_size per step:
    # epoch 0 continues at position 8; its tail shorter than a batch is dropped as in any epoch
    # (3 per step: 16 left = 5 batches + 1 dropped; 8 per step: 2 batches, none dropped).
    first = PromptDataLoader(dataset24, 4, seed=1)
    before = _draws(first, 2)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = PromptDataLoader(dataset24, new_size, seed=1)
    resumed.load_state_dict(state)
    batches_left = (24 - 8) // new_size
    assert len(resumed) - resumed.batches_done_in_epoch == batches_left
    after = _draws(resumed, batches_left + 1)
    epoch0 = before + [d for d in after if d[0] == 0]
    order = PromptDataLoader(dataset24, 1, seed=1)._epoch_order(0)
    assert [i for _, i in epoch0] == order[: 8 + batches_left * new_size]  # each drawn once, in order
    assert [e for e, _ in after[batches_left * new_size:]] == [1] * new_size  # then epoch 1 from its start
    assert [i for _, i in after[batches_left * new_size:]] == PromptDataLoader(dataset24, 1, seed=1)._epoch_order(1)[
        :new_size]


@pytest.mark.parametrize("new_size", [3, 8])
def test_old_batch_count_state_is_read_at_its_own_batch_size(dataset24, new_size):
    # A state that counted batches (2 batches of 4) names position 8, whatever the new batch size.
    reference = PromptDataLoader(dataset24, new_size, seed=1)
    reference.prompts_done_in_epoch = 8
    old = PromptDataLoader(dataset24, new_size, seed=1)
    old.load_state_dict({"epoch": 0, "batches_done_in_epoch": 2, "seed": 1, "num_prompts_per_batch": 4})
    assert _draws(old, 3) == _draws(reference, 3)
    same = PromptDataLoader(dataset24, 4, seed=1)  # no batch size saved: this loader's (unchanged run)
    same.load_state_dict({"epoch": 0, "batches_done_in_epoch": 2, "seed": 1})
    assert same.prompts_done_in_epoch == 8


def test_state_from_another_permutation_is_refused(dataset, dataset24):
    state = PromptDataLoader(dataset24, 4, seed=1).state_dict()
    with pytest.raises(DatasetError, match="saved with dataset_size 24, this run has dataset_size 50"):
        PromptDataLoader(dataset, 4, seed=1).load_state_dict(state)
    with pytest.raises(DatasetError, match="saved with shuffle True, this run has shuffle False"):
        PromptDataLoader(dataset24, 4, seed=1, shuffle=False).load_state_dict(state)
