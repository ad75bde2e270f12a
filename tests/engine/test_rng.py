"""engine/core/rng.py: seeds are pure functions of their keys, stable across processes, and never touch global RNGs."""

import hashlib
import random
import subprocess
import sys

import numpy as np
import torch

from engine.core.rng import batch_seed, content_seed, derive_seed, generator_from, hash_into, seed_family, seed_worker


def digest_of(value, **options):
    digest = hashlib.blake2b(digest_size=8)
    hash_into(digest, value, **options)
    return digest.hexdigest()


class TestDeriveSeed:
    def test_the_same_in_another_process(self):
        code = "from engine.core.rng import derive_seed; print(derive_seed(7, 'split', 3))"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
        assert int(other.stdout) == derive_seed(7, "split", 3)

    def test_each_key_and_its_order_matter_and_seeds_fit_63_bits(self):
        seeds = {derive_seed(7, "split"), derive_seed(8, "split"), derive_seed(7, "order"), derive_seed("split", 7),
                 derive_seed(7), derive_seed("7")}
        assert len(seeds) == 6 and all(0 <= seed < 2**63 for seed in seeds)


    def test_a_seed_family_gives_derive_seed_of_its_keys_and_the_member_key(self):
        rows = seed_family(7, "transform", "train", 3)
        assert [rows(index) for index in (0, 1, 250)] == [derive_seed(7, "transform", "train", 3, index)
                                                          for index in (0, 1, 250)]
        assert rows("a") == derive_seed(7, "transform", "train", 3, "a") != rows(0)


class TestBatchSeed:
    def test_depends_on_seed_epoch_and_the_rows_in_order(self):
        base = batch_seed(1, 0, [3, 4, 5])
        assert base == batch_seed(1, 0, (3, 4, 5))
        assert len({base, batch_seed(2, 0, [3, 4, 5]), batch_seed(1, 1, [3, 4, 5]), batch_seed(1, 0, [5, 4, 3]),
                    batch_seed(1, 0, [3, 4])}) == 5


class TestGenerators:
    def test_generator_from_leaves_the_global_rng_alone(self):
        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        first = torch.rand(2, generator=generator_from(5))
        assert torch.equal(torch.rand(3), expected)
        assert torch.equal(first, torch.rand(2, generator=generator_from(5)))

    def test_seed_worker_seeds_random_and_numpy_from_torch(self):
        torch.manual_seed(1234)
        seed_worker(0)
        drawn = (random.random(), np.random.random())
        random.seed(torch.initial_seed() & 0xFFFFFFFF)
        np.random.seed(torch.initial_seed() & 0xFFFFFFFF)
        assert drawn == (random.random(), np.random.random())


class TestHashInto:
    def test_tensors_and_arrays_hash_alike_and_dtype_and_shape_matter(self):
        values = np.arange(6, dtype=np.int64)
        assert digest_of(torch.from_numpy(values)) == digest_of(values)
        assert digest_of(values) != digest_of(values.astype(np.int32))
        assert digest_of(values) != digest_of(values.reshape(2, 3))

    def test_mappings_hash_by_key_not_insertion_order(self):
        assert digest_of({"a": 1, "b": [2, 3]}) == digest_of({"b": [2, 3], "a": 1})
        assert digest_of({"a": 1}) != digest_of({"a": 2}) != digest_of([1])

    def test_max_elements_samples_long_values_at_a_fixed_cost(self):
        long = torch.arange(10_000)
        changed = long.clone()
        changed[1] = -1  # not one of the strided elements
        assert digest_of(long, max_elements=100) == digest_of(changed, max_elements=100)
        assert digest_of(long) != digest_of(changed)

    def test_content_seed_follows_the_rows(self):
        rows = [{"input_ids": torch.arange(5)}]
        assert content_seed(3, rows) == content_seed(3, [{"input_ids": torch.arange(5)}])
        assert content_seed(3, rows) != content_seed(4, rows) != content_seed(3, [{"input_ids": torch.arange(6)}])
