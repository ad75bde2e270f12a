"""hash_into (which seeds stream batches) gives the digest of its reference, value by value: one update of
collected bytes changes the speed, never a seed."""

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rng import content_seed, hash_into


def reference_hash_into(digest, value, *, max_elements=None):
    """The implementation before the speed-up, kept verbatim as the reference."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        flat = value.reshape(-1)
        if max_elements is not None and flat.size > max_elements:
            flat = flat[:: -(-flat.size // max_elements)]
        digest.update(np.ascontiguousarray(flat).tobytes())
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            digest.update(repr(key).encode())
            reference_hash_into(digest, value[key], max_elements=max_elements)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            reference_hash_into(digest, item, max_elements=max_elements)
    else:
        digest.update(repr(value).encode())


class Rows(list):
    pass


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                    st.binary(max_size=8), st.builds(np.int64, st.integers(-5, 5)))
arrays = st.builds(lambda n, k: torch.arange(n, dtype=torch.int32).reshape(k, -1) if n % k == 0 else
                   np.arange(n, dtype=np.float64), st.integers(0, 300), st.sampled_from([1, 2, 3]))
values = st.recursive(scalars | arrays, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple), st.lists(inner, max_size=3).map(Rows),
    st.dictionaries(st.text(max_size=4), inner, max_size=3),
    st.dictionaries(st.integers(0, 9), inner, max_size=3).map(OrderedDict)), max_leaves=12)


@settings(max_examples=80, deadline=None)
@given(values, st.sampled_from([None, 1, 256]))
def test_digest_equals_the_reference(value, max_elements):
    ours, reference = hashlib.blake2b(digest_size=8), hashlib.blake2b(digest_size=8)
    hash_into(ours, value, max_elements=max_elements)
    reference_hash_into(reference, value, max_elements=max_elements)
    assert ours.digest() == reference.digest()


def test_a_stream_batch_seed_is_unchanged():
    rows = [{"text": "river stone", "label": 3, "ids": torch.arange(300)}, {"text": "", "label": 0, "ids": []}]
    digest = hashlib.blake2b(b"7", digest_size=8)
    reference_hash_into(digest, rows, max_elements=256)
    assert content_seed(7, rows) == int.from_bytes(digest.digest(), "little") & ((1 << 63) - 1)
