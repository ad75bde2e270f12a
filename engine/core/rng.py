"""Randomness as a function: every random choice derives its seed from (seed, epoch, indices), never from state.

Because a batch's generator depends only on what the batch is, the worker that builds it, the rank that
asked for it and the point a run resumed from cannot change the result.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from engine.core.checks import check_int

_MASK63 = (1 << 63) - 1


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed that is a fixed function of ``keys`` (ints or strings), stable across processes and runs."""
    digest = hashlib.blake2b(digest_size=8)
    for key in keys:
        digest.update(repr(key).encode())
        digest.update(b"\x00")
    return int.from_bytes(digest.digest(), "little") & _MASK63


def seed_family(*keys: int | str) -> Callable[[int | str], int]:
    """``key -> derive_seed(*keys, key)``, with the shared ``keys`` hashed once: the seeds of many rows at the
    cost of hashing their own keys only."""
    prefix = hashlib.blake2b(digest_size=8)
    for key in keys:
        prefix.update(repr(key).encode())
        prefix.update(b"\x00")

    def member(key: int | str) -> int:
        digest = prefix.copy()
        digest.update(repr(key).encode())
        digest.update(b"\x00")
        return int.from_bytes(digest.digest(), "little") & _MASK63

    return member


def drawn_seed(seed: int | None) -> int:
    """``seed``, checked, or for ``None`` a fresh one (``secrets.randbits(31)``), drawn once, for the caller to
    record where a resume reads it (the module's ``seed``, its state and its checkpoint's hyperparameters)."""
    return secrets.randbits(31) if seed is None else check_int("seed", seed, minimum=0)


def batch_seed(seed: int, epoch: int, indices: Iterable[int]) -> int:
    """The seed of one batch: a function of the run seed, the epoch and the sample indices it holds."""
    digest = hashlib.blake2b(np.asarray(list(indices), dtype=np.int64).tobytes(), digest_size=8)
    digest.update(f"{seed}:{epoch}".encode())
    return int.from_bytes(digest.digest(), "little") & _MASK63


def generator_from(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``, leaving the global RNG untouched."""
    return torch.Generator().manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random`` and NumPy in a worker from the seed torch gave that worker.

    torch seeds each worker with ``base_seed + worker_id``, and the factory draws ``base_seed`` from a
    generator seeded by the loader's seed, so user transforms that use these libraries are reproducible.
    """
    worker_seed = torch.initial_seed() & 0xFFFFFFFF
    random.seed(worker_seed)
    np.random.seed(worker_seed)


def hash_into(digest: Any, value: Any, *, max_elements: int | None = None) -> None:
    """Feed ``value`` (tensors, arrays, mappings, sequences, scalars) into a hashlib ``digest``.

    ``max_elements`` hashes at most that many evenly strided elements of each tensor or array (plus its shape):
    enough to tell batches apart when the hash only seeds randomness, at a fixed cost per row. The bytes are
    collected first and fed in one ``update`` (the same digest as feeding them one by one).
    """
    parts: list[bytes] = []
    _collect(value, parts, max_elements)
    digest.update(b"".join(parts))


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _collect(value: Any, parts: list[bytes], max_elements: int | None) -> None:
    """The bytes :func:`hash_into` hashes for ``value``, appended to ``parts`` (exact builtin types first: this
    runs for every value of every row of a stream)."""
    kind = type(value)
    if kind in _SCALARS:
        parts.append(repr(value).encode())
    elif kind is dict:
        for key in sorted(value, key=str):
            parts.append(repr(key).encode())
            _collect(value[key], parts, max_elements)
    elif kind is list or kind is tuple:
        parts.append(f"{kind.__name__}{len(value)}".encode())
        if not _collect_dict_rows(value, parts, max_elements):
            for item in value:
                _collect(item, parts, max_elements)
    elif isinstance(value, (torch.Tensor, np.ndarray)):
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        parts.append(f"{array.dtype}{array.shape}".encode())
        flat = array.reshape(-1)
        if max_elements is not None and flat.size > max_elements:
            flat = flat[:: -(-flat.size // max_elements)]
        parts.append(np.ascontiguousarray(flat).tobytes())
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            parts.append(repr(key).encode())
            _collect(value[key], parts, max_elements)
    elif isinstance(value, (list, tuple)):
        parts.append(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _collect(item, parts, max_elements)
    else:
        parts.append(repr(value).encode())


def _collect_dict_rows(rows: list[Any] | tuple[Any, ...], parts: list[bytes], max_elements: int | None) -> bool:
    """The bytes of a batch of dict rows with the same keys (in the same order), appended to ``parts`` as
    :func:`_collect` would append them row by row; False (nothing appended) for any other sequence.

    A column whose values are tensors (or arrays) of one dtype, shape and device is read in one stack, and a column
    of builtin scalars with one ``repr`` each, so a stream batch costs a few calls per column, not per value.
    """
    if len(rows) < 2 or type(rows[0]) is not dict:
        return False
    keys = tuple(rows[0])
    if not all(type(row) is dict and tuple(row) == keys for row in rows):
        return False
    columns = [(repr(key).encode(), _column_bytes([row[key] for row in rows], max_elements))
               for key in sorted(keys, key=str)]
    for position in range(len(rows)):
        for key_bytes, column in columns:
            parts.append(key_bytes)
            parts.append(column[position])
    return True


def _column_bytes(values: list[Any], max_elements: int | None) -> list[bytes]:
    """The bytes :func:`_collect` gives each of ``values`` (one column of a batch), batched where they allow."""
    first = values[0]
    if type(first) in _SCALARS and all(type(value) in _SCALARS for value in values):
        return [repr(value).encode() for value in values]
    stacked = None
    if isinstance(first, torch.Tensor):
        dtype, shape, device = first.dtype, first.shape, first.device
        if all(isinstance(v, torch.Tensor) and v.dtype == dtype and v.shape == shape and v.device == device
               for v in values):
            with torch.no_grad():
                stacked = torch.stack(values).cpu().numpy()
    elif isinstance(first, np.ndarray):
        dtype, shape = first.dtype, first.shape
        if all(isinstance(v, np.ndarray) and v.dtype == dtype and v.shape == shape for v in values):
            stacked = np.stack(values)
    if stacked is None:  # mixed kinds, shapes or dtypes: value by value
        collected = []
        for value in values:
            own: list[bytes] = []
            _collect(value, own, max_elements)
            collected.append(b"".join(own))
        return collected
    header = f"{stacked.dtype}{stacked.shape[1:]}".encode()
    flat = stacked.reshape(len(values), -1)
    if max_elements is not None and flat.shape[1] > max_elements:
        flat = flat[:, :: -(-flat.shape[1] // max_elements)]
    data = np.ascontiguousarray(flat).tobytes()
    width = len(data) // len(values)
    return [header + data[position * width:(position + 1) * width] for position in range(len(values))]


def content_seed(seed: int, rows: Any) -> int:
    """The seed of a batch that has no indices (rows from a stream): a function of the seed and the rows."""
    digest = hashlib.blake2b(str(seed).encode(), digest_size=8)
    hash_into(digest, rows, max_elements=256)
    return int.from_bytes(digest.digest(), "little") & _MASK63
