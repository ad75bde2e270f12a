import pytest

from engine import SeededBatchSampler


def _epoch(epoch, rows=12, batch=4, seed=0):
    sampler = SeededBatchSampler(rows, batch, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return epoch_batches(sampler)


def epoch_batches(sampler):
    return [list(batch) for batch in sampler]


class TestOrder:
    def test_same_seed_same_order(self):
        assert epoch_batches(SeededBatchSampler(50, 8, shuffle=True, seed=5)) == epoch_batches(
            SeededBatchSampler(50, 8, shuffle=True, seed=5)
        )

    def test_each_epoch_a_new_order_covering_all_rows(self):
        sampler = SeededBatchSampler(50, 8, shuffle=True, seed=5)
        first, second = epoch_batches(sampler), epoch_batches(sampler)
        assert first != second
        assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b) == list(range(50))

    def test_set_epoch_pins_the_order(self):
        a, b = SeededBatchSampler(30, 4, shuffle=True, seed=0), SeededBatchSampler(30, 4, shuffle=True, seed=0)
        epoch_batches(a)  # epoch 0
        b.set_epoch(1)
        assert epoch_batches(a) == epoch_batches(b)

    def test_unshuffled_is_sequential(self):
        assert epoch_batches(SeededBatchSampler(5, 2)) == [[0, 1], [2, 3], [4]]

    def test_drop_last_and_len(self):
        sampler = SeededBatchSampler(10, 4, drop_last=True)
        assert len(sampler) == 2 and [len(b) for b in sampler] == [4, 4]

    def test_batches_carry_a_seed_that_depends_on_epoch_and_rows(self):
        sampler = SeededBatchSampler(8, 4, shuffle=False, seed=1)
        first, second = list(sampler), list(sampler)
        assert first[0].rng_seed != first[1].rng_seed
        assert first[0].rng_seed != second[0].rng_seed  # same rows, next epoch
        assert list(SeededBatchSampler(8, 4, seed=1))[0].rng_seed == first[0].rng_seed


class TestRanks:
    @pytest.mark.parametrize(("uneven", "per_rank"), [("pad", 6), ("drop", 5)])
    def test_ranks_get_equal_disjoint_shares(self, uneven, per_rank):
        ranks = [SeededBatchSampler(11, 4, shuffle=True, seed=2, num_replicas=2, rank=r, uneven=uneven)
                 for r in range(2)]
        shares = [[i for b in s for i in b] for s in ranks]
        assert [len(s) for s in shares] == [per_rank, per_rank]
        assert len(ranks[0]) == len(ranks[1])
        if uneven == "drop":
            assert not set(shares[0]) & set(shares[1])
        else:
            assert set(shares[0]) | set(shares[1]) == set(range(11))

    def test_bad_rank(self):
        with pytest.raises(ValueError, match=r"rank should be in \[0, num_replicas=2\), but got rank=2"):
            SeededBatchSampler(10, 2, num_replicas=2, rank=2)


class TestState:
    def test_resume_mid_epoch_yields_exactly_the_rest(self):
        sampler = SeededBatchSampler(40, 6, shuffle=True, seed=9)
        epoch_batches(sampler)
        iterator = iter(sampler)
        seen = [list(next(iterator)) for _ in range(3)]
        state = sampler.state_dict()
        rest = [list(b) for b in iterator]
        resumed = SeededBatchSampler(40, 6, shuffle=True, seed=9)
        resumed.load_state_dict(state)
        assert epoch_batches(resumed) == rest
        assert len(seen) + len(rest) == len(sampler)

    def test_state_saved_at_epoch_end_starts_the_next_epoch(self):
        sampler = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        epoch_batches(sampler)
        state = sampler.state_dict()
        expected = epoch_batches(sampler)
        resumed = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        resumed.load_state_dict(state)
        assert state["epoch"] == 1 and epoch_batches(resumed) == expected

    def test_state_saved_after_the_last_batch_was_handed_out(self):
        # Worker-mode snapshots are taken when the last index is dispatched, before the epoch completes.
        sampler = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        iterator = iter(sampler)
        for _ in range(3):
            next(iterator)
        state = sampler.state_dict()
        assert state == {"seed": 0, "epoch": 0, "position": 3, "epoch_offset": 0, "num_replicas": 1,
                         "global_batch": sampler.batch_size, "served": []}
        plain = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        plain.load_state_dict(state)
        assert epoch_batches(plain) == _epoch(1)  # epoch 0 was done: no empty pass first
        later = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        later.set_epoch(1)  # a later epoch pinned before the loader applies its state at iter()
        later.load_state_dict(state)
        assert epoch_batches(later) == _epoch(1)
        same = SeededBatchSampler(12, 4, shuffle=True, seed=0)
        same.set_epoch(0)  # the caller asks for the rest of epoch 0 itself (e.g. a multi-loader's child pass)
        same.load_state_dict(state)
        assert epoch_batches(same) == [] and epoch_batches(same) == _epoch(1)

    def test_state_from_another_seed_is_refused(self):
        with pytest.raises(ValueError, match="saved with seed=1, but this sampler has seed=2"):
            SeededBatchSampler(10, 2, seed=2).load_state_dict({"seed": 1, "epoch": 0, "position": 0})

    def test_incomplete_state_is_refused(self):
        with pytest.raises(KeyError, match=r"sampler state is missing \['position'\]"):
            SeededBatchSampler(10, 2).load_state_dict({"seed": 0, "epoch": 0})


class TestShardedEval:
    @pytest.mark.parametrize(("rows", "batch", "ranks"), [(17, 4, 2), (16, 4, 2), (3, 8, 2), (10, 3, 3), (9, 4, 1)])
    def test_every_row_once_and_equal_batch_counts(self, rows, batch, ranks):
        from engine.sampling.eval import ShardedEvalBatchSampler

        per_rank = [[list(b) for b in ShardedEvalBatchSampler(rows, batch, num_replicas=ranks, rank=r)]
                    for r in range(ranks)]
        assert len({len(batches) for batches in per_rank}) == 1
        assert all(0 < len(b) <= batch for batches in per_rank for b in batches)
        assert sorted(i for batches in per_rank for b in batches for i in b) == list(range(rows))

    def test_randomness_repeats_every_pass(self):
        from engine.sampling.eval import ShardedEvalBatchSampler

        sampler = ShardedEvalBatchSampler(8, 4, seed=3)
        assert [b.rng_seed for b in sampler] == [b.rng_seed for b in sampler]

    def test_fewer_rows_than_ranks(self):
        from engine.sampling.eval import ShardedEvalBatchSampler

        with pytest.raises(ValueError, match="1 evaluation rows cannot be shared by 2 ranks without duplicating"):
            ShardedEvalBatchSampler(1, 4, num_replicas=2, rank=0)


class TestLightningEpochHandle:
    def test_set_epoch_on_the_handle_reaches_the_batch_sampler(self):
        sampler = SeededBatchSampler(20, 4, shuffle=True, seed=1)
        sampler.sampler.set_epoch(3)  # where Lightning calls it: dataloader.batch_sampler.sampler
        other = SeededBatchSampler(20, 4, shuffle=True, seed=1)
        other.set_epoch(3)
        assert sampler.epoch == 3 and epoch_batches(sampler) == epoch_batches(other)
