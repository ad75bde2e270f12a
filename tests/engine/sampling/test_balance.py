"""balance='compute': each step's packed documents dealt to ranks so the cost model tokens + w * sum(len**2) is
balanced, keeping every guarantee of packing: each document once per epoch, the token budget, the same batches for
any worker count, exact and elastic resume. Ranks are simulated by one sampler per rank, stepped in lockstep."""

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collators.packed import PackedCollator
from engine.datamodule.universal import UniversalDataModule
from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory, batch_sampler_for
from engine.sampling.balance import SummedCost, check_balance, document_costs, refine, step_balance
from engine.sampling.packed import PackedBatchSampler
from engine.sources.wrappers import TensorListSource
from task_spec import TaskSpec

BUDGET, WEIGHT = 4096, 1 / 1024
GLOBAL = 8 * BUDGET
"""Tokens of one step across ranks: every number of ranks here gets a per-rank budget of at least BUDGET."""
LOGNORMAL = np.clip(np.random.default_rng(0).lognormal(5.5, 1.2, 20000).astype(np.int64), 1, BUDGET)
"""A long-tailed corpus: median about 245 tokens, a tail up to the budget."""


def ranks(world, lengths=LOGNORMAL, budget=GLOBAL, balance="compute", **options):
    weight = WEIGHT if balance == "compute" else None
    return [PackedBatchSampler(lengths, budget // world, seed=7, num_replicas=world, rank=r, balance=balance,
                               attention_weight=weight, **options) for r in range(world)]


def lockstep(samplers):
    """Every step of the current pass: one batch per rank, in lockstep (every rank has as many)."""
    per_rank = [[list(batch) for batch in sampler] for sampler in samplers]
    assert len({len(batches) for batches in per_rank}) == 1, "ranks would wait for each other"
    return [list(step) for step in zip(*per_rank)]


def rows_of(steps):
    return [row for step in steps for batch in step for row in batch]


class TestBalance:
    def test_max_over_mean_cost_per_step_is_at_most_1_05_on_a_long_tailed_corpus_at_8_ranks(self):
        costs = document_costs(LOGNORMAL, WEIGHT)
        balanced, plain = lockstep(ranks(8)), lockstep(ranks(8, balance="tokens"))
        epoch_ratio, worst = step_balance(balanced, costs)
        assert epoch_ratio <= 1.05, (epoch_ratio, worst)
        assert step_balance(plain, costs)[0] > 1.2  # the corpus is one where plain packing leaves ranks waiting

    def test_the_documents_served_are_plain_packings_and_every_bin_keeps_the_budget(self):
        balanced, plain = lockstep(ranks(8)), lockstep(ranks(8, balance="tokens"))
        assert Counter(rows_of(balanced)) == Counter(rows_of(plain))  # pad repeats the same few bins
        assert set(rows_of(balanced)) == set(range(len(LOGNORMAL)))
        assert all(0 < LOGNORMAL[batch].sum() <= BUDGET for step in balanced for batch in step)

    @settings(max_examples=25, deadline=None)
    @given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=120), world=st.integers(1, 5),
           seed=st.integers(0, 3), weight=st.sampled_from([0.0, 0.01, 1.0]), uneven=st.sampled_from(["pad", "drop"]))
    def test_every_document_once_per_epoch(self, lengths, world, seed, weight, uneven):
        lengths = np.array(lengths)
        samplers = [PackedBatchSampler(lengths, 64, seed=seed, num_replicas=world, rank=r, uneven=uneven,
                                       balance="compute", attention_weight=weight) for r in range(world)]
        plain = [PackedBatchSampler(lengths, 64, seed=seed, num_replicas=world, rank=r, uneven=uneven)
                 for r in range(world)]
        for _ in range(2):  # two epochs
            steps, bins = lockstep(samplers), plain[0].all_bins(samplers[0].epoch - 1)
            served = Counter(rows_of(steps))
            assert served == Counter(rows_of(lockstep(plain)))
            if len(bins) % world == 0:
                assert sorted(served.elements()) == list(range(len(lengths)))
            assert all(0 < lengths[batch].sum() <= 64 for step in steps for batch in step)

    def test_refine_moves_documents_from_the_costliest_rank_within_the_budget(self):
        lengths = np.array([8, 1, 1, 1, 1, 4, 4])
        costs = document_costs(lengths, 0.5)
        before = [[0, 1, 2], [3, 4, 5, 6]]
        after = refine(before, SummedCost(lengths, costs, 12))
        assert sorted(sum(after, [])) == list(range(7)) and all(lengths[b].sum() <= 12 for b in after)
        assert max(costs[b].sum() for b in after) < max(costs[b].sum() for b in before)

    def test_one_rank_and_weight_zero_leave_plain_packing(self):
        assert lockstep(ranks(1)) == lockstep(ranks(1, balance="tokens"))


class TestOrder:
    def test_the_same_seed_gives_the_same_steps_and_each_epoch_new_ones(self):
        first, again = ranks(4), ranks(4)
        epochs = [lockstep(first) for _ in range(2)]
        assert epochs[0] != epochs[1] and [lockstep(again) for _ in range(2)] == epochs

    def test_workers_0_and_2_give_identical_batches(self):
        generator = torch.Generator().manual_seed(0)
        rows = [torch.randint(5, 500, (int(n),), generator=generator)
                for n in torch.distributions.LogNormal(3.0, 1.0).sample((150,)).clamp(1, 256)]
        source = TensorListSource(rows)

        def loader(workers, rank):
            sampler = batch_sampler_for(source, batching="packed", batch_size=8, max_tokens=256, seed=4,
                                        num_replicas=2, rank=rank, balance="compute", attention_weight=0.01)
            forked = {"timeout": 60, "multiprocessing_context": "fork"} if workers else {}
            config = DataLoaderConfig(num_workers=workers, seed=4, collate_fn=PackedCollator(), **forked)
            return DataLoaderFactory().create_dataloader(source, config, batch_sampler=sampler)

        for rank in (0, 1):
            expected, got = list(loader(0, rank)), list(loader(2, rank))
            assert len(expected) == len(got) > 1
            for a, b in zip(expected, got):
                assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["cu_seq_lens_q"],
                                                                                   b["cu_seq_lens_q"])


class TestResume:  # an exact resume: tests/engine/sampling/test_balance_modes.py, under both budget modes
    @pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (4, 2)])
    def test_an_elastic_resume_serves_every_remaining_row_once(self, before, after):
        lengths = LOGNORMAL[:3000]
        samplers = ranks(before, lengths)
        iterators = [iter(s) for s in samplers]
        served = [row for _ in range(6) for iterator in iterators for row in next(iterator)]
        state = samplers[0].state_dict()
        resumed = ranks(after, lengths)
        for sampler in resumed:
            sampler.load_state_dict(state)
        rest = lockstep(resumed)
        later, remaining = rows_of(rest), set(range(len(lengths))) - set(served)
        assert len(served) == len(set(served)) and set(later) == remaining
        most = max(len(batch) for step in rest for batch in step)
        assert len(later) - len(set(later)) < after * most  # pad repeats fewer than `after` bins
        assert all(lengths[batch].sum() <= GLOBAL // after for step in rest for batch in step)
        fresh = ranks(after, lengths)
        for sampler in fresh:
            sampler.set_epoch(1)
        assert lockstep(resumed) == lockstep(fresh)  # the next epoch is a fresh run's on the new ranks

    def test_a_state_saved_without_balancing_is_refused(self):
        state = ranks(2, balance="tokens")[0].state_dict()
        with pytest.raises(ValueError, match="sampler state was saved from other lengths or options"):
            ranks(2)[0].load_state_dict(state)


class TestRefusals:
    @pytest.mark.parametrize(("balance", "weight", "match"), [
        ("compute", None, r"balance='compute' needs attention_weight=\.\.\."),
        ("compute", -1.0, r"attention_weight should be a finite number >= 0, but got attention_weight=-1.0"),
        ("compute", float("nan"), r"attention_weight should be a finite number >= 0"),
        ("tokens", 0.1, r"attention_weight=0.1 weighs the cost model of balance='compute', but balance='tokens'"),
        ("flops", None, r"balance should be one of \('tokens', 'compute'\), but got balance='flops'"),
    ])
    def test_the_sampler_refuses_what_cannot_hold(self, balance, weight, match):
        with pytest.raises(ValueError, match=match):
            check_balance(balance, weight)
        with pytest.raises(ValueError, match=match):
            PackedBatchSampler([3, 4], 8, balance=balance, attention_weight=weight)

    ROWS = [torch.arange(n) for n in range(5, 40)]

    @pytest.mark.parametrize("batching", ["plain", "grouped"])
    def test_the_module_refuses_balance_without_a_token_budget(self, batching):
        with pytest.raises(ValueError, match=f"balance='compute' \\(balance= was given\\) deals the documents of "
                                             f"each step's token-budget batches to ranks by their cost, but "
                                             f"batching='{batching}'; pass batching='packed' or 'token_budget'"):
            UniversalDataModule(self.ROWS, task_spec=TaskSpec.lm_tiny(), batching=batching, balance="compute",
                                attention_weight=0.01)

    def test_the_module_refuses_balance_over_a_stream(self):
        datasets = pytest.importorskip("datasets")
        stream = datasets.Dataset.from_dict({"input_ids": [list(range(n)) for n in range(5, 20)]}).to_iterable_dataset()
        with pytest.raises(ValueError, match=r"balance='compute' \(balance= was given\) deals each step's documents "
                                             r"to ranks by their lengths, which a stream"):
            UniversalDataModule(stream, task_spec=TaskSpec.lm_tiny(), balance="compute", attention_weight=0.01)

    def test_the_spec_can_set_balance_and_its_weight(self):
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"batching": "packed", "max_tokens": 64,
                                                                "balance": "compute", "attention_weight": 0.01})
        dm = UniversalDataModule(self.ROWS, task_spec=spec)
        assert (dm.balance, dm.attention_weight) == ("compute", 0.01)
        assert dm.train_dataloader().batch_sampler.balance == "compute"
