import functools

import numpy as np
import pytest

from shardtrain.data.batching import batch_by_size, ordered_indices
from shardtrain.data.collate import collate
from shardtrain.data.iterators import EpochBatchIterator
from shardtrain.data.token_block import TokenBlockDataset
from shardtrain.core.errors import CheckpointError, DataError

from fakes import EOS, PAD, CountingDataset, FakeIndexedDataset, lines_with_sizes, list_collate

# 11 batches of distinct, known ids: batch j holds 3j .. 3j+2 (the last is short).
BATCHES = [np.arange(3 * j, min(3 * j + 3, 32)) for j in range(11)]


def make_itr(num_shards=1, shard_id=0, seed=7, dataset=None, **kwargs):
    dataset = dataset if dataset is not None else CountingDataset(32)
    return EpochBatchIterator(dataset, list_collate, BATCHES, seed=seed,
                              num_shards=num_shards, shard_id=shard_id, **kwargs)


def run(itr, epochs):
    """All batches of ``epochs`` epochs, as lists of ids; {} for filler."""
    out = []
    for _ in range(epochs):
        out.extend(list(itr.next_epoch_itr()))
    return out


def epoch_order(seed, epoch):
    """fairseq: np.random.shuffle(list(batches)) under numpy_seed(seed + epoch)."""
    batches = list(BATCHES)
    np.random.RandomState(seed + epoch).shuffle(batches)
    return [b.tolist() for b in batches]


def test_batch_order_is_fairseqs_per_epoch_shuffle():
    itr = make_itr()
    assert run(itr, 1) == epoch_order(7, 1)
    assert run(itr, 1) == epoch_order(7, 2)
    assert epoch_order(7, 1) != epoch_order(7, 2)
    assert run(make_itr(epoch=2), 1) == epoch_order(7, 2)
    assert run(make_itr(shuffle=False), 1) == [b.tolist() for b in BATCHES]
    assert run(make_itr(), 1) != run(make_itr(seed=8), 1)


def test_counters_and_epoch_bookkeeping():
    itr = make_itr()
    assert len(itr) == 11 and itr.next_epoch_idx == 1 and itr.iterations_in_epoch == 0
    epoch_itr = itr.next_epoch_itr()
    assert len(epoch_itr) == 11 and epoch_itr.n == 0 and epoch_itr.has_next()
    next(epoch_itr)
    next(epoch_itr)
    assert itr.iterations_in_epoch == 2 and not itr.end_of_epoch() and itr.next_epoch_idx == 1
    list(epoch_itr)
    assert itr.end_of_epoch() and itr.next_epoch_idx == 2 and not epoch_itr.has_next()
    assert itr.state_dict() == {"epoch": 2, "iterations_in_epoch": 0, "shuffle": True,
                                "num_shards": 1, "global_batches_done": 0}
    itr.next_epoch_itr()
    assert itr.epoch == 2


def test_shards_cover_every_batch_once_with_equal_step_counts():
    shards = [run(make_itr(num_shards=3, shard_id=r), 1) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4] and len(make_itr(num_shards=3)) == 4
    # 11 = 4 + 4 + 3: the third rank ends with one empty filler batch
    assert [s.count({}) for s in shards] == [0, 0, 1] and shards[2][-1] == {}
    real = [b for s in shards for b in s if b != {}]
    assert sorted(real) == sorted(b.tolist() for b in BATCHES)
    # Rank r takes the epoch's shuffled batches r, r + 3, ...
    assert shards[1] == epoch_order(7, 1)[1::3]
    assert shards[2][:3] == epoch_order(7, 1)[2::3]


def test_batches_are_read_lazily_one_at_a_time():
    data = CountingDataset(32)
    epoch_itr = make_itr(dataset=data).next_epoch_itr()
    assert data.reads == []
    first = next(epoch_itr)
    assert data.reads == first


@pytest.mark.parametrize("stop", [0, 1, 6, 10, 11, 13, 22])
def test_resume_continues_exactly_also_across_epochs(stop):
    expected = run(make_itr(), 3)
    itr = make_itr()
    seen = []
    while len(seen) < stop:
        epoch_itr = itr.next_epoch_itr()
        for batch in epoch_itr:
            seen.append(batch)
            if len(seen) == stop:
                break
    state = itr.state_dict()
    data = CountingDataset(32)
    resumed = make_itr(dataset=data)
    resumed.load_state_dict(state)
    assert data.reads == []  # skipping never reads the skipped batches
    assert resumed.state_dict() == state
    while len(seen) < len(expected):
        seen.extend(list(resumed.next_epoch_itr()))
    assert seen == expected
    assert resumed.epoch == 3


def test_resume_with_a_prefetch_buffer_gives_the_same_batches():
    expected = run(make_itr(), 2)
    itr = make_itr(buffer_size=3)
    epoch_itr = itr.next_epoch_itr()
    seen = [next(epoch_itr) for _ in range(4)]
    resumed = make_itr(buffer_size=3)
    resumed.load_state_dict(itr.state_dict())
    seen += run(resumed, 2)
    assert seen == expected


def test_buffer_passes_errors_through():
    class Broken(CountingDataset):
        def __getitem__(self, i):
            raise KeyError(i)

    with pytest.raises(KeyError):
        next(make_itr(dataset=Broken(32), buffer_size=2).next_epoch_itr())


@pytest.mark.parametrize("old, new, steps", [(2, 3, 2), (3, 2, 1), (2, 4, 3), (4, 1, 1)])
def test_resume_with_another_world_size_covers_the_remaining_batches(old, new, steps):
    order = epoch_order(7, 1)
    ranks = [make_itr(num_shards=old, shard_id=r) for r in range(old)]
    before = []
    for itr in ranks:
        epoch_itr = itr.next_epoch_itr()
        before += [next(epoch_itr) for _ in range(steps)]
    state = ranks[0].state_dict()
    assert state["global_batches_done"] == steps * old
    after = []
    for r in range(new):
        itr = make_itr(num_shards=new, shard_id=r)
        itr.load_state_dict(state)
        after += [b for b in itr.next_epoch_itr() if b != {}]
        assert itr.iterations_in_epoch == len(itr)
    assert sorted(before) == sorted(order[:steps * old])
    remaining = order[steps * old:]
    assert all(b in after for b in remaining)  # nothing skipped ...
    repeated = [b for b in after if b not in remaining]
    assert all(b in before for b in repeated) and len(repeated) < new  # ... few repeated
    assert len(after) == len(remaining) + len(repeated)


def test_callable_sampler_is_asked_per_epoch():
    calls = []

    def sampler(epoch):
        calls.append(epoch)
        return [np.array([epoch, 10 + epoch])]

    itr = EpochBatchIterator(CountingDataset(32), list_collate, sampler, seed=1)
    assert run(itr, 2) == [[1, 11], [2, 12]]
    assert calls == [1, 2]


def test_first_batch_is_a_stand_in_for_filler_steps():
    assert make_itr(num_shards=3, shard_id=2).first_batch == [0, 1, 2]
    empty = EpochBatchIterator(CountingDataset(0), list_collate, [], seed=1)
    with pytest.raises(DataError, match="no batches"):
        empty.first_batch
    assert run(empty, 1) == [] and empty.end_of_epoch()


def test_resume_past_the_end_of_changed_data_is_a_checkpoint_error():
    itr = make_itr()
    with pytest.raises(CheckpointError, match="--reset-dataloader"):
        itr.load_state_dict({"epoch": 1, "iterations_in_epoch": 11, "shuffle": True})


def test_end_to_end_lm_pipeline():
    data = FakeIndexedDataset(lines_with_sizes([5, 3, 1, 7, 2, 4, 6, 1, 3] * 4))
    blocks = TokenBlockDataset(data, data.sizes, 8, PAD, EOS, "complete")
    order = ordered_indices(blocks.sizes, seed=1)
    batches = batch_by_size(order, blocks.sizes, max_tokens=16)
    itr = EpochBatchIterator(blocks, functools.partial(collate, pad=PAD), batches, seed=1,
                             num_shards=2, shard_id=1)
    seen_ids = []
    for batch in itr.next_epoch_itr():
        if not batch:
            continue
        assert batch["target"].numel() <= 16
        assert batch["ntokens"] == int(batch["target"].ne(PAD).sum())
        for src, tgt, n in zip(batch["net_input"]["src_tokens"], batch["target"],
                               batch["net_input"]["src_lengths"].tolist()):
            # complete blocks start a line: EOS, then the target shifted right
            assert src[:n].tolist() == [EOS] + tgt[:n - 1].tolist()
        seen_ids += batch["id"].tolist()
    shuffled = [b.tolist() for b in batches]
    np.random.RandomState(1 + 1).shuffle(shuffled)
    assert seen_ids == [i for b in shuffled[1::2] for i in b]
