"""PackedBatchSampler: whole documents in bins of at most max_tokens, each exactly once per epoch, a new seeded
order every epoch, equal batch counts on every rank, exact resume."""

import numpy as np
import pytest
import torch

from collators.packed import PackedCollator
from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory, batch_sampler_for
from engine.sampling.modes import resolve_batching
from engine.sampling.packed import PackedBatchSampler, best_fit_decreasing
from engine.sources.wrappers import TensorListSource
from task_spec import TaskSpec

LENGTHS = np.random.default_rng(0).integers(32, 513, 6000)  # uniform 32..512, as in the issue
BUDGET = 4096


def epoch(sampler):
    return [list(batch) for batch in sampler]


class TestPacking:
    def test_at_least_99_percent_of_the_budget_is_real_tokens(self):
        sampler = PackedBatchSampler(LENGTHS, BUDGET, seed=0)
        for number in range(2):
            bins = epoch(sampler)
            fill = LENGTHS.sum() / (len(bins) * BUDGET)
            assert fill >= 0.99, f"epoch {number}: {fill:.4f}"
            assert sampler.fill(number) == pytest.approx(fill)

    def test_every_document_exactly_once_per_epoch_and_never_over_budget(self):
        sampler = PackedBatchSampler(LENGTHS, BUDGET, seed=3)
        for _ in range(3):
            bins = epoch(sampler)
            rows = [row for b in bins for row in b]
            assert sorted(rows) == list(range(len(LENGTHS)))
            assert max(int(LENGTHS[b].sum()) for b in bins) <= BUDGET

    def test_a_new_order_each_epoch_and_the_same_order_for_the_same_seed(self):
        first, again, other = (PackedBatchSampler(LENGTHS, BUDGET, seed=s) for s in (5, 5, 6))
        epochs = [epoch(first) for _ in range(3)]
        assert epochs[0] != epochs[1] != epochs[2]
        assert [epoch(again) for _ in range(3)] == epochs
        assert epoch(other) != epochs[0]
        assert {frozenset(b) for b in epochs[0]} != {frozenset(b) for b in epochs[1]}  # other bins, not just order

    def test_best_fit_decreasing_fills_the_fullest_bin_that_holds_a_row(self):
        lengths = np.array([6, 5, 4, 1, 3])
        assert best_fit_decreasing(np.array([0, 1, 2, 4, 3]), lengths, 10) == [[0, 2], [1, 4, 3]]

    def test_a_document_longer_than_the_budget_is_refused_naming_it(self):
        with pytest.raises(ValueError, match=r"1 row\(s\) are longer than max_tokens=100: row 2 has 101 tokens .* "
                                             r"raise max_tokens to at least 101"):
            PackedBatchSampler([5, 100, 101], 100)

    def test_rows_are_counted_as_the_collator_will_cut_them(self):
        sampler = PackedBatchSampler([300, 20, 100], 128, max_length=100, seed=0)
        assert sorted(sampler.lengths.tolist()) == [20, 100, 100] and len(sampler) == 2
        with pytest.raises(ValueError, match="row 0 has 300 tokens"):
            PackedBatchSampler([300, 20, 100], 128)

    def test_an_empty_document_is_refused_naming_it(self):
        with pytest.raises(ValueError, match="row 1 has 0 tokens"):
            PackedBatchSampler([5, 0, 7], 100)


class TestRanks:
    @pytest.mark.parametrize("uneven", ["pad", "drop"])
    def test_two_ranks_get_equal_counts_and_disjoint_bins(self, uneven):
        lengths = LENGTHS[:1001]
        ranks = [PackedBatchSampler(lengths, BUDGET, seed=2, num_replicas=2, rank=r, uneven=uneven) for r in (0, 1)]
        total = len(PackedBatchSampler(lengths, BUDGET, seed=2).all_bins(0))
        assert total % 2 == 1  # so the ranks must be equalized
        for _ in range(2):
            shares = [epoch(s) for s in ranks]
            assert len(shares[0]) == len(shares[1]) == (total + 1 if uneven == "pad" else total - 1) // 2
            rows = [[i for b in share for i in b] for share in shares]
            if uneven == "drop":
                assert not set(rows[0]) & set(rows[1]) and len(set(rows[0] + rows[1])) == len(rows[0] + rows[1])
            else:  # one bin repeated from the start of the epoch's order; every row served
                assert set(rows[0]) | set(rows[1]) == set(range(len(lengths)))
                assert len(rows[0]) + len(rows[1]) - len(lengths) == len(shares[1][-1])
                assert shares[1][-1] == shares[0][0]

    def test_fewer_bins_than_ranks_still_equal(self):
        counts = [len(PackedBatchSampler([5, 6], 100, num_replicas=4, rank=r)) for r in range(4)]
        assert counts == [1, 1, 1, 1]


class TestResume:
    def test_state_mid_epoch_gives_exactly_the_remaining_bins(self):
        sampler = PackedBatchSampler(LENGTHS, BUDGET, seed=1)
        epoch(sampler)
        iterator = iter(sampler)
        seen = [list(next(iterator)) for _ in range(5)]
        state = sampler.state_dict()
        rest = [list(b) for b in iterator]
        resumed = PackedBatchSampler(LENGTHS, BUDGET, seed=1)
        resumed.load_state_dict(state)
        assert epoch(resumed) == rest and len(seen) + len(rest) == len(sampler)

    def test_state_from_another_budget_is_refused(self):
        state = PackedBatchSampler(LENGTHS, BUDGET).state_dict()
        with pytest.raises(ValueError, match=f"saved with a global batch of {BUDGET} .* build it with "
                                             f"max_tokens={BUDGET}"):
            PackedBatchSampler(LENGTHS, 2 * BUDGET).load_state_dict(state)


class TestThroughLoader:
    def test_workers_0_and_2_give_identical_packed_batches(self):
        generator = torch.Generator().manual_seed(0)
        rows = [torch.randint(5, 500, (int(n),), generator=generator) for n in torch.randint(3, 60, (120,))]
        source = TensorListSource(rows)

        def loader(workers):
            sampler = batch_sampler_for(source, batching="packed", batch_size=8, max_tokens=256, seed=4)
            config = DataLoaderConfig(num_workers=workers, seed=4, collate_fn=PackedCollator())
            return DataLoaderFactory().create_dataloader(source, config, batch_sampler=sampler)

        plain, workers = loader(0), loader(2)
        expected, got = [list(plain), list(plain)], [list(workers), list(workers)]
        assert [len(e) for e in expected] == [len(g) for g in got]
        for e, g in zip(expected, got):
            for a, b in zip(e, g):
                assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
        assert expected[0][0]["input_ids"].shape[1] <= 256


class TestResolve:
    def test_packed_needs_a_budget_from_the_arguments_or_the_spec(self):
        assert resolve_batching(TaskSpec.lm_tiny(), "packed", 2048)[:2] == ("packed", 2048)
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"batching": "packed", "max_tokens": 1024})
        assert resolve_batching(spec, None, None) == ("packed", 1024, "spec.preprocessing_config['batching']")
        with pytest.raises(ValueError, match=r"batching='packed' needs max_tokens=\.\.\."):
            resolve_batching(TaskSpec.lm_tiny(), "packed", None)

    @pytest.mark.parametrize("spec", [TaskSpec.seq2seq_tiny(), TaskSpec.cls_tiny()], ids=lambda s: s.task_type)
    def test_a_task_that_cannot_be_packed_is_refused_naming_the_modes_that_work(self, spec):
        with pytest.raises(ValueError, match=f"task_type='{spec.task_type}'; use batching='plain', 'grouped' or "
                                             f"'token_budget' for {spec.task_type}"):
            resolve_batching(spec, "packed", 512)
