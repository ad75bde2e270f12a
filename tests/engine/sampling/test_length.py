import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory, batch_sampler_for
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.modes import resolve_batching
from engine.sampling.seeded import SeededBatchSampler
from engine.sources.lengths import lengths_of
from engine.sources.wrappers import TensorListSource, TorchSource
from task_spec import TaskSpec

LENGTHS = np.random.default_rng(0).integers(32, 513, 6000)  # uniform 32..512, as in the issue


def epoch(sampler):
    return [list(batch) for batch in sampler]


def padding_share(batches, lengths):
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1 - real / padded


def samplers(lengths=LENGTHS, seed=0, **kwargs):
    return [LengthGroupedBatchSampler(lengths, 32, seed=seed, **kwargs),
            TokenBudgetBatchSampler(lengths, 8192, seed=seed, **kwargs)]


def pad_rows(rows):  # module level: picklable for worker processes
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)


class DictRows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


class TestLengthsOf:
    def test_hf_column_through_a_select_view(self):
        data = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in range(1, 11)], "text": ["a"] * 10})
        view = data.select([7, 3, 1]).with_format("torch")
        assert lengths_of(view, "input_ids").tolist() == [8, 4, 2]

    def test_hf_text_column_has_no_length(self):
        data = datasets.Dataset.from_dict({"text": ["a b", "c"]})
        with pytest.raises(TypeError, match="column 'text' is string, which has no per-row length; tokenize"):
            lengths_of(data, "text")
        with pytest.raises(KeyError, match="columns are"):
            lengths_of(data, "input_ids")

    def test_tensor_list_and_its_view(self, token_tensors):
        source = TensorListSource(token_tensors, key="input_ids")
        assert lengths_of(source, "input_ids").tolist() == [len(t) for t in token_tensors]
        assert lengths_of(source.view(np.array([5, 2])), "input_ids").tolist() == [len(token_tensors[i])
                                                                                    for i in (5, 2)]

    def test_torch_dataset_falls_back_to_len_of_each_row(self):
        source = TorchSource(DictRows([{"input_ids": [0] * n} for n in (3, 1, 4)]))
        assert lengths_of(source, "input_ids").tolist() == [3, 1, 4]
        with pytest.raises(KeyError, match=r"row 0 has no 'tokens' to measure \(found \['input_ids'\]\)"):
            lengths_of(source, "tokens")
        with pytest.raises(TypeError, match="row 0: 'n' is a int, which has no length"):
            lengths_of(DictRows([{"n": 1}]), "n")


class TestEpochs:
    @pytest.mark.parametrize("index", [0, 1], ids=["grouped", "token_budget"])
    def test_every_row_exactly_once_per_epoch(self, index):
        sampler = samplers()[index]
        for _ in range(2):
            assert sorted(i for b in epoch(sampler) for i in b) == list(range(len(LENGTHS)))

    @pytest.mark.parametrize("index", [0, 1], ids=["grouped", "token_budget"])
    def test_padding_share_at_most_5_percent(self, index):
        sampler = samplers()[index]
        assert padding_share(epoch(sampler), LENGTHS) <= 0.05

    @pytest.mark.parametrize("index", [0, 1], ids=["grouped", "token_budget"])
    def test_new_order_each_epoch_same_order_for_the_same_seed(self, index):
        first, second = samplers()[index], samplers()[index]
        assert epoch(first) == epoch(second)
        again = epoch(first)
        assert again != epoch(samplers()[index])
        assert epoch(samplers(seed=1)[index]) != epoch(samplers()[index])
        widths = [max(LENGTHS[b]) for b in again[:20]]
        assert widths != sorted(widths) and widths != sorted(widths, reverse=True)  # batches are shuffled

    def test_grouped_batch_sizes_and_drop_last(self):
        lengths = np.arange(1, 102)
        assert sorted(len(b) for b in LengthGroupedBatchSampler(lengths, 10, seed=0)) == [1] + [10] * 10
        dropped = LengthGroupedBatchSampler(lengths, 10, seed=0, drop_last=True)
        assert [len(b) for b in dropped] == [10] * 10 and len(dropped) == 10

    def test_bad_arguments_name_the_parameter(self):
        with pytest.raises(ValueError, match="batch_size should be a positive integer, but got batch_size=0"):
            LengthGroupedBatchSampler(LENGTHS, 0)
        with pytest.raises(ValueError, match="lengths should be a 1-D array of ints"):
            LengthGroupedBatchSampler([[1, 2]], 2)
        with pytest.raises(ValueError, match=r"rank should be in \[0, num_replicas=2\), but got rank=2"):
            TokenBudgetBatchSampler(LENGTHS, 8192, num_replicas=2, rank=2)
        with pytest.raises(ValueError, match="uneven should be one of"):
            TokenBudgetBatchSampler(LENGTHS, 8192, uneven="spread")


class TestTokenBudget:
    def test_budget_never_exceeded(self):
        for max_tokens in (600, 4096, 20000):
            batches = epoch(TokenBudgetBatchSampler(LENGTHS, max_tokens, seed=3))
            assert max(len(b) * LENGTHS[b].max() for b in batches) <= max_tokens

    def test_a_row_over_budget_raises_naming_it(self):
        lengths = np.array([10, 10, 700, 10])
        with pytest.raises(ValueError, match=r"1 row\(s\) are longer than max_tokens=512: row 2 has 700 tokens"):
            TokenBudgetBatchSampler(lengths, 512)

    def test_oversized_alone_gets_a_batch_of_its_own(self):
        lengths = np.array([10, 10, 700, 10, 900])
        batches = epoch(TokenBudgetBatchSampler(lengths, 512, oversized="alone"))
        assert sorted(b for b in batches if len(b) == 1 and lengths[b[0]] > 512) == [[2], [4]]
        assert all(len(b) * lengths[b].max() <= 512 for b in batches if lengths[b].max() <= 512)

    def test_max_batch_size_and_pad_to_multiple_of(self):
        lengths = np.full(100, 9)
        assert {len(b) for b in TokenBudgetBatchSampler(lengths, 1000, max_batch_size=16)} <= set(range(1, 17))
        assert max(len(b) for b in TokenBudgetBatchSampler(lengths, 64, pad_to_multiple_of=16)) == 4


class TestResume:
    @pytest.mark.parametrize("index", [0, 1], ids=["grouped", "token_budget"])
    def test_state_mid_epoch_gives_exactly_the_remaining_batches(self, index):
        sampler = samplers()[index]
        epoch(sampler)
        iterator = iter(sampler)
        seen = [list(next(iterator)) for _ in range(5)]
        state = sampler.state_dict()
        rest = [list(b) for b in iterator]
        resumed = samplers()[index]
        resumed.load_state_dict(state)
        assert epoch(resumed) == rest and len(seen) + len(rest) == len(sampler)

    def test_state_from_other_lengths_raises(self):
        state = LengthGroupedBatchSampler(LENGTHS, 32).state_dict()
        with pytest.raises(ValueError, match="sampler state was saved from other lengths or options"):
            LengthGroupedBatchSampler(LENGTHS[:-1], 32).load_state_dict(state)


class TestThroughLoader:
    @pytest.mark.parametrize("kind", ["grouped", "token_budget"])
    def test_workers_0_and_2_give_identical_batches_and_resume(self, kind, token_tensors):
        source = TensorListSource(token_tensors)

        def loader(workers):
            sampler = batch_sampler_for(source, batching=kind, batch_size=8, max_tokens=120 if
                                        kind == "token_budget" else None, seed=4)
            config = DataLoaderConfig(batch_size=8, num_workers=workers, seed=4, collate_fn=pad_rows)
            return DataLoaderFactory().create_dataloader(source, config, batch_sampler=sampler)

        plain, workers = loader(0), loader(2)
        expected = [list(plain), list(plain)]  # two epochs
        got = [list(workers), list(workers)]
        assert all(torch.equal(a, b) for e, g in zip(expected, got) for a, b in zip(e, g))
        assert [len(e) for e in expected] == [len(g) for g in got]
        first = loader(2)
        iterator = iter(first)
        for _ in range(3):
            next(iterator)
        state = first.state_dict()
        resumed = loader(2)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(expected[0]) - 3
        assert all(torch.equal(a, b) for a, b in zip(rest, expected[0][3:]))


class TestRanks:
    @pytest.mark.parametrize("index", [0, 1], ids=["grouped", "token_budget"])
    @pytest.mark.parametrize("uneven", ["pad", "drop"])
    def test_equal_counts_and_disjoint_shares(self, index, uneven):
        lengths = LENGTHS[:1001]
        ranks = [samplers(lengths, num_replicas=3, rank=r, uneven=uneven)[index] for r in range(3)]
        for _ in range(2):  # two epochs
            batches = [epoch(s) for s in ranks]
            assert len({len(b) for b in batches}) == 1 and len({len(s) for s in ranks}) == 1
            rows = [[i for b in rank for i in b] for rank in batches]
            unique = [set(r) for r in rows]
            if uneven == "drop":
                assert all(len(r) == len(u) for r, u in zip(rows, unique))  # no duplicates at all
                assert not (unique[0] & unique[1] or unique[0] & unique[2] or unique[1] & unique[2])
            else:
                assert set().union(*unique) == set(range(len(lengths)))
                for rank in batches:  # a rank's batches: its own disjoint rows, then repeats of them to fill
                    first_repeat = next((k for k, b in enumerate(rank) if b in rank[:k]), len(rank))
                    own = [i for b in rank[:first_repeat] for i in b]
                    assert len(own) == len(set(own)) and all(b in rank[:first_repeat] for b in rank[first_repeat:])
                if index == 0:  # grouped pads rows, fewer than num_replicas, like SeededBatchSampler
                    assert sum(len(r) for r in rows) - len(lengths) < 3

    def test_fewer_rows_than_ranks_still_equal(self):
        counts = [len(TokenBudgetBatchSampler([5, 6], 100, num_replicas=4, rank=r)) for r in range(4)]
        assert counts == [1, 1, 1, 1]


class TestResolve:
    def test_arguments_then_spec_then_plain(self):
        spec = TaskSpec.lm_tiny()
        assert resolve_batching(spec, None, None) == ("plain", None, "the default")
        assert resolve_batching(spec, "grouped", None) == ("grouped", None, "batching= was given")
        budget = spec.replace(preprocessing_config={"batching": "token_budget", "max_tokens": 4096})
        assert resolve_batching(budget, None, None) == ("token_budget", 4096, "spec.preprocessing_config['batching']")
        assert resolve_batching(budget, "token_budget", 4096)[:2] == ("token_budget", 4096)  # both agree
        with pytest.raises(ValueError, match=r"batching='grouped' contradicts spec.preprocessing_config\['batching'\]="
                                             r"'token_budget'; set it in one place"):
            resolve_batching(budget, "grouped", None)
        with pytest.raises(ValueError, match=r"max_tokens=512 contradicts spec.preprocessing_config\['max_tokens'\]"):
            resolve_batching(budget, None, 512)
        budget_only = spec.replace(preprocessing_config={"max_tokens": 4096})
        with pytest.raises(ValueError, match=r"max_tokens=4096 applies only to .*\(spec.preprocessing_config"):
            resolve_batching(budget_only, None, None)  # a budget no batch would follow

    def test_bad_mode_and_missing_budget(self):
        with pytest.raises(ValueError, match="batching should be one of"):
            resolve_batching(None, "sorted", None)
        with pytest.raises(ValueError, match=r"batching='token_budget' needs max_tokens=\.\.\."):
            resolve_batching(None, "token_budget", None)
        with pytest.raises(ValueError, match="max_tokens=512 applies only to batching='token_budget'"):
            resolve_batching(None, "grouped", 512)
        with pytest.raises(ValueError, match="max_tokens should be a positive integer, but got max_tokens=0"):
            resolve_batching(None, "token_budget", 0)
        with pytest.raises(ValueError, match="batching='grouped' .* shuffles batches every epoch, but shuffle=False"):
            resolve_batching(None, "grouped", None, shuffle=False)
        plain = batch_sampler_for(list(range(10)), batching="plain", batch_size=4, seed=0)
        assert isinstance(plain, SeededBatchSampler) and [len(b) for b in plain] == [4, 4, 2]
