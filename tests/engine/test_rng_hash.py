"""hash_into (which seeds stream batches) gives the digest of its reference, value by value: one update of
collected bytes changes the speed, never a seed."""

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.rng import content_seed, hash_into


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


def _column(kind, n, shape, dtype):
    """``n`` values of one column of a batch: equal-shaped tensors or arrays (the stacked path), scalars, or
    tensors of varying shapes (value by value)."""
    values = (torch.arange(n * int(np.prod(shape))) % 7).to(dtype).reshape(n, *shape)
    if kind == "tensor":
        return list(values.unbind(0))
    if kind == "array":
        return list(values.numpy())
    if kind == "scalar":
        return [[3, "river", 2.5, None, True][i % 5] for i in range(n)]
    return [torch.arange(i % 3 + 1).to(dtype) for i in range(n)]  # "ragged"


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.dictionaries(
    st.sampled_from(["images", "labels", "text", 1, "1", "ids"]),
    st.tuples(st.sampled_from(["tensor", "array", "scalar", "ragged"]), st.sampled_from([(), (3,), (2, 3, 300), (0,)]),
              st.sampled_from([torch.uint8, torch.int64, torch.float32, torch.bool])), min_size=1, max_size=4),
    st.sampled_from([None, 256]))
def test_a_batch_of_dict_rows_hashes_as_its_rows_one_by_one(n, spec, max_elements):
    """Rows sharing keys take the column-stacked path; its digest is the reference's, for tensor, array, scalar
    and ragged columns, keys whose str() collide (1 and '1'), empty and 0-d values, strided and whole."""
    columns = {key: _column(kind, n, shape, dtype) for key, (kind, shape, dtype) in spec.items()}
    rows = [{key: values[i] for key, values in columns.items()} for i in range(n)]
    for value in (rows, tuple(rows)):
        ours, reference = hashlib.blake2b(digest_size=8), hashlib.blake2b(digest_size=8)
        hash_into(ours, value, max_elements=max_elements)
        reference_hash_into(reference, value, max_elements=max_elements)
        assert ours.digest() == reference.digest()


def test_rows_whose_keys_or_kinds_differ_hash_as_the_reference():
    """Rows with other keys, keys in another order, a mixed column (tensor and scalar, two dtypes) or a non-dict
    row fall back to row by row, with the reference's digest."""
    cases = [
        [{"a": torch.arange(3), "b": 1}, {"b": 2, "a": torch.arange(3)}],
        [{"a": torch.arange(3)}, {"a": torch.arange(3), "c": 0}],
        [{"a": torch.arange(3)}, {"a": 7}],
        [{"a": torch.arange(3)}, {"a": torch.arange(3, dtype=torch.int32)}],
        [{"a": torch.arange(3)}, OrderedDict(a=torch.arange(3))],
        [{"a": torch.ones(2, requires_grad=True)}, {"a": torch.zeros(2, requires_grad=True)}],
    ]
    for rows in cases:
        ours, reference = hashlib.blake2b(digest_size=8), hashlib.blake2b(digest_size=8)
        hash_into(ours, rows, max_elements=256)
        reference_hash_into(reference, rows, max_elements=256)
        assert ours.digest() == reference.digest(), rows
