from __future__ import annotations

import pickle
import random
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.datasets import ByteBudgetLRU, HDF5Dataset, sizeof


class TestSizeof:
    def test_counts_payload_bytes(self):
        assert sizeof(torch.zeros(3, 4, dtype=torch.float64)) == 96
        assert sizeof(np.zeros(5, dtype=np.int16)) == 10
        assert sizeof("héllo") == 6 and sizeof("hello") == 5  # bytes of the UTF-8 encoding, not characters
        assert sizeof(b"abc") == 3
        assert sizeof(7) == sizeof(1.5) == 8
        assert sizeof({"a": torch.zeros(2, dtype=torch.uint8), "b": ["xy", 1]}) == 2 + 2 + 8

    def test_a_view_counts_its_own_elements(self):
        assert sizeof(torch.zeros(100)[:10]) == 40


class TestByteBudgetLRU:
    def test_get_counts_hits_and_misses(self):
        cache = ByteBudgetLRU(100)
        cache.put("a", b"1234")
        assert cache.get("a") == b"1234" and cache.get("b") is None and cache.get("b", "default") == "default"
        stats = cache.stats()
        assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (1, 2, 1 / 3)

    def test_evicts_least_recently_used_first(self):
        cache = ByteBudgetLRU(12)
        for key in "abc":
            cache.put(key, b"xxxx")
        cache.get("a")  # now b is the least recently used
        cache.put("d", b"xxxx")
        assert cache.keys() == ["c", "a", "d"] and cache.stats()["evictions"] == 1
        cache.put("e", b"xxxxxxxx")  # needs two slots: c, then a go
        assert cache.keys() == ["d", "e"] and cache.stats()["evictions"] == 3

    def test_membership_does_not_refresh_recency(self):
        cache = ByteBudgetLRU(8)
        cache.put("a", b"xxxx")
        cache.put("b", b"xxxx")
        assert "a" in cache
        cache.put("c", b"xxxx")
        assert "a" not in cache and cache.keys() == ["b", "c"]

    def test_an_item_bigger_than_the_budget_is_not_cached(self):
        cache = ByteBudgetLRU(10)
        cache.put("small", b"12345")
        assert cache.put("big", b"x" * 11) is False
        assert "big" not in cache and "small" in cache and cache.stats()["rejected"] == 1

    def test_replacing_a_key_recounts_its_size(self):
        cache = ByteBudgetLRU(10)
        cache.put("a", b"12345678")
        cache.put("a", b"12")
        assert cache.nbytes == 2 and len(cache) == 1
        assert cache.put("a", b"x" * 20) is False and "a" not in cache and cache.nbytes == 0

    def test_batched_get_and_put(self):
        cache = ByteBudgetLRU(8)
        cache.put_many([("a", b"12"), ("b", b"34"), ("c", b"56")])
        assert cache.get_many(["b", "x", "a"]) == [b"34", None, b"12"]
        assert cache.stats()["hits"] == 2 and cache.stats()["misses"] == 1
        cache.put_many([("d", b"78"), ("e", b"90")])  # the lookups left c least recently used
        assert cache.keys() == ["b", "a", "d", "e"] and cache.nbytes == 8 and cache.stats()["evictions"] == 1

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 12), st.integers(0, 9)), max_size=8)),
                    max_size=12), st.integers(0, 40))
    def test_batched_calls_equal_calls_one_by_one(self, calls, budget):
        """put_many (at once when new keys fit, else one by one) and get_many leave the cache, its order and its
        counters as put() and get() one at a time would, repeated keys and evictions included."""
        batched, single = ByteBudgetLRU(budget), ByteBudgetLRU(budget)
        for is_put, pairs in calls:
            if is_put:
                items = [(key, b"x" * size) for key, size in pairs]
                batched.put_many(items)
                for key, value in items:
                    single.put(key, value)
            else:
                keys = [key for key, _ in pairs]
                assert batched.get_many(keys) == [single.get(key) for key in keys]
            assert batched.keys() == single.keys() and batched.stats() == single.stats()
            assert list(batched._items.items()) == list(single._items.items())

    def test_explicit_nbytes_is_used(self):
        cache = ByteBudgetLRU(10)
        cache.put("a", object(), nbytes=6)
        assert cache.nbytes == 6

    def test_budget_is_never_exceeded(self):
        rng = random.Random(0)
        cache = ByteBudgetLRU(1000)
        for _ in range(2000):
            key = rng.randrange(50)
            if rng.random() < 0.5:
                cache.put(key, torch.zeros(rng.randrange(0, 300), dtype=torch.uint8))
            else:
                cache.get(key)
            assert cache.nbytes <= 1000
            assert cache.nbytes == sum(sizeof(value) for value in cache._items.values())

    def test_zero_budget_caches_nothing(self):
        cache = ByteBudgetLRU(0)
        cache.put("a", b"x")
        assert len(cache) == 0 and cache.put("empty", b"") is True

    def test_threads_keep_the_invariants(self):
        cache = ByteBudgetLRU(500)

        def work(seed):
            rng = random.Random(seed)
            for _ in range(2000):
                key = rng.randrange(40)
                if rng.random() < 0.5:
                    cache.put(key, b"x" * rng.randrange(1, 60))
                else:
                    cache.get(key)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = cache.stats()
        assert stats["nbytes"] <= 500 and stats["hits"] + stats["misses"] > 0
        assert stats["nbytes"] == sum(len(value) for value in cache._items.values())

    def test_pickles_as_an_empty_cache_with_the_same_budget(self):
        cache = ByteBudgetLRU(64)
        cache.put("a", b"1234")
        cache.get("a")
        clone = pickle.loads(pickle.dumps(cache))
        assert clone.max_bytes == 64 and len(clone) == 0 and clone.stats()["hits"] == 0
        clone.put("b", b"12")
        assert clone.get("b") == b"12"

    def test_clear_and_reset_stats(self):
        cache = ByteBudgetLRU(64)
        cache.put("a", b"1234")
        cache.get("a")
        cache.clear()
        assert len(cache) == 0 and cache.nbytes == 0 and cache.stats()["hits"] == 1
        cache.reset_stats()
        assert cache.stats()["hits"] == 0

    @pytest.mark.parametrize(("budget", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                                   ("10", TypeError)])
    def test_bad_budget(self, budget, error):
        with pytest.raises(error, match="max_bytes should be a non-negative integer, but got max_bytes="):
            ByteBudgetLRU(budget)


def held_bytes(cache):
    """The bytes the cache's tensors really keep alive: each distinct storage once, whatever views it."""
    storages = {}
    for value in cache._items.values():
        for tensor in value.values() if isinstance(value, dict) else [value]:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


def own(row):
    return row.clone()


class TestSharedBuffers:
    """put_shared caches views of one buffer without copies, and copies them out as soon as one leaves, so the
    bytes counted are always the bytes held."""

    def test_views_are_held_without_copies_while_all_are_cached(self):
        buffer = torch.arange(40, dtype=torch.uint8).reshape(10, 4)
        cache = ByteBudgetLRU(100)
        cache.put_shared(list(enumerate(buffer.unbind(0))), own)
        assert all(cache.get(i).untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
                   for i in range(10))
        assert cache.nbytes == held_bytes(cache) == 40

    def test_an_eviction_copies_out_the_rest_in_place(self):
        buffer = torch.arange(40, dtype=torch.uint8).reshape(10, 4)
        cache = ByteBudgetLRU(40)
        cache.put_shared(list(enumerate(buffer.unbind(0))), own)
        cache.get(0)  # 1 is now the least recently used
        cache.put("new", torch.zeros(4, dtype=torch.uint8))
        assert cache.keys() == [2, 3, 4, 5, 6, 7, 8, 9, 0, "new"]  # the copies kept their recency
        assert all(torch.equal(cache.get(i), buffer[i]) and cache.get(i).untyped_storage().nbytes() == 4
                   for i in [0, *range(2, 10)])
        assert cache.nbytes == held_bytes(cache) == 40

    def test_a_budget_smaller_than_the_read_copies_what_it_keeps(self):
        buffer = torch.arange(80, dtype=torch.float32).reshape(20, 4)
        cache = ByteBudgetLRU(5 * 16)
        cache.put_shared(list(enumerate(buffer.unbind(0))), own)
        assert cache.keys() == [15, 16, 17, 18, 19] and cache.stats()["evictions"] == 15
        assert cache.nbytes == held_bytes(cache) == 80
        assert all(torch.equal(cache.get(i), buffer[i]) for i in range(15, 20))

    def test_replacing_or_rejecting_one_view_copies_out_the_others(self):
        buffer = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
        cache = ByteBudgetLRU(12)
        cache.put_shared(list(enumerate(buffer.unbind(0))), own)
        cache.put(1, torch.ones(4, dtype=torch.uint8))
        assert cache.nbytes == held_bytes(cache) == 12 and torch.equal(cache.get(0), buffer[0])
        big = torch.arange(20, dtype=torch.uint8)
        cache = ByteBudgetLRU(12)
        cache.put_shared([("a", big[:4]), ("b", big[4:20])], own)  # b alone is over the budget
        assert cache.keys() == ["a"] and cache.stats()["rejected"] == 1 and held_bytes(cache) == cache.nbytes == 4

    def test_repeated_keys_in_one_read_keep_the_last(self):
        buffer = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
        cache = ByteBudgetLRU(100)
        cache.put_shared([(0, buffer[0]), (1, buffer[1]), (0, buffer[2])], own)
        assert torch.equal(cache.get(0), buffer[2]) and cache.nbytes == held_bytes(cache) == 8

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["read", "put", "get"]), st.integers(0, 30), st.integers(1, 12)),
                    max_size=40), st.integers(0, 200))
    def test_the_bytes_counted_are_the_bytes_held(self, operations, budget):
        """Any mix of shared reads, plain puts and gets: within the budget, counted = held, values unchanged."""
        cache, expected = ByteBudgetLRU(budget), {}
        for operation, key, rows in operations:
            if operation == "read":  # rows key..key+rows-1 of one buffer, 8 bytes each
                buffer = torch.arange(key, key + rows, dtype=torch.int64).reshape(rows, 1)
                cache.put_shared([(key + i, row) for i, row in enumerate(buffer.unbind(0))], own)
                expected.update({key + i: key + i for i in range(rows)})
            elif operation == "put":
                cache.put(key, torch.full((rows,), key, dtype=torch.uint8))
                expected[key] = key
            else:
                cache.get(key)
            assert cache.nbytes <= budget and cache.nbytes == held_bytes(cache)
            assert cache.nbytes == sum(sizeof(value) for value in cache._items.values())
            assert cache._sizes.keys() == cache._items.keys() and cache.nbytes == sum(cache._sizes.values())
            assert all(bool((value == expected[key]).all()) for key, value in cache._items.items())


class TestCachedDataset:
    def test_later_epochs_hit_the_cache_when_it_fits(self, h5_path):
        ds = HDF5Dataset(h5_path, mode="cached")
        ds.__getitems__(range(len(ds)))
        ds.__getitems__(range(len(ds)))
        stats = ds.cache.stats()
        assert stats["misses"] == len(ds) and stats["hits"] == len(ds) and stats["evictions"] == 0

    def test_a_small_budget_holds_the_most_recent_rows(self, h5_path):
        row_bytes = 48 + 8 + 2  # x: 12 float32, y: int64, z: int16
        ds = HDF5Dataset(h5_path, keys=["x", "y", "group/z"], mode="cached", cache_bytes=5 * row_bytes)
        for index in range(len(ds)):
            ds[index]
            assert ds.cache.nbytes <= 5 * row_bytes
        assert ds.cache.keys() == list(range(len(ds) - 5, len(ds)))

    def test_each_process_starts_with_an_empty_cache(self, h5_path):
        ds = HDF5Dataset(h5_path, mode="cached")
        ds[0]
        clone = pickle.loads(pickle.dumps(ds))
        assert len(clone.cache) == 0 and clone.cache.max_bytes == ds.cache.max_bytes

    def test_lazy_and_eager_have_no_cache(self, h5_path):
        assert HDF5Dataset(h5_path).cache is None and HDF5Dataset(h5_path, mode="eager").cache is None

    def test_shuffled_batches_under_a_small_budget_hold_only_what_they_count(self, h5_path, rows_equal):
        """HDF5 rows are cached as views of their read; under shuffled batches with evictions the memory the
        cache keeps alive is what it counts, within the budget, and every batch has LAZY's rows."""
        row_bytes = 48 + 8 + 2
        ds = HDF5Dataset(h5_path, mode="cached", cache_bytes=15 * row_bytes)
        lazy = HDF5Dataset(h5_path)
        rng = np.random.default_rng(0)
        for _ in range(4):
            order = rng.permutation(len(ds))
            for start in range(0, len(ds), 6):
                batch = order[start:start + 6].tolist()
                rows_equal(ds.__getitems__(batch), lazy.__getitems__(batch))
                assert ds.cache.nbytes <= 15 * row_bytes and ds.cache.nbytes == held_bytes(ds.cache)
        assert ds.cache.stats()["hits"] > 0 and ds.cache.stats()["evictions"] > 0
