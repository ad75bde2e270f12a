"""Per-row transforms (``train_transform=``, ``eval_transform=``) and their seeding.

A transform runs on each row where the rows are read (in the worker that reads them), after any cache, so random
augmentation is fresh every epoch in every loading mode. Its randomness is a function of (seed, epoch, dataset
index), never of the process, the worker count or the resume point:

- training rows: ``derive_seed(seed, "transform", "train", epoch, index)``, new every epoch;
- validation, test and prediction rows: ``derive_seed(seed, "transform", split, index)``, the same every pass.

A transform that takes a ``generator`` keyword is called as ``transform(row, generator=g)`` with a CPU
``torch.Generator`` seeded so, and the global random state is not touched. Any other transform
(``torchvision.transforms.v2``, ``torchaudio.transforms``, a function using ``random`` or NumPy) runs with
torch's CPU generator, ``random`` and NumPy's global generator seeded so for that row; the caller's global states
are saved before the batch and restored after it, so a pass in the main process neither depends on nor changes
them.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from engine.core.rng import generator_from, seed_family

TRANSFORM_ARGUMENTS = {"train": "train_transform", "val": "eval_transform", "test": "eval_transform",
                       "predict": "eval_transform"}
"""The module argument whose transform each split applies."""


class TransformFailed(Exception):
    """A row's transform raised; ``index`` is the row's dataset index, ``error`` the exception (named by the
    source, which knows its split)."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


def check_transform(name: str, transform: Any) -> None:
    """Refuse a ``transform`` argument that is neither None nor callable, naming it and what is expected."""
    if transform is not None and not callable(transform):
        raise TypeError(
            f"{name} should be a callable applied to each row (a torchvision.transforms.v2 transform, a "
            f"torchaudio transform or a function of the row), but got {name}={transform!r:.80} "
            f"({type(transform).__name__})"
        )


def takes_generator(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` accepts a ``generator`` keyword argument (then it gets one, seeded per row)."""
    try:
        parameters = inspect.signature(transform).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature: call them plainly
        return False
    parameter = parameters.get("generator")
    return parameter is not None and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    """Run the body with torch's CPU, ``random``'s and NumPy's global states saved and restored afterwards."""
    torch_state, python_state, numpy_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def seed_global_rng(seed: int) -> None:
    """Seed torch's CPU generator (not CUDA's), ``random`` and NumPy's global generator with ``seed``."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


def held_arrays(row: Any) -> Any:
    """``row`` with each writable numpy array at its top level (a dict's value, a tuple's item, the row) copied: an
    array has no record of writes, so a transform that writes into one it is given (``row["x"] *= 2``) writes into
    a copy, never into the stored data (a dict of numpy columns hands views of its columns)."""
    def own(value: Any) -> Any:
        return value.copy() if isinstance(value, np.ndarray) and value.flags.writeable else value

    if isinstance(row, np.ndarray):
        return own(row)
    if isinstance(row, dict):  # a plain dict in any case: a transform that sets a key leaves the source's dict be
        return {key: own(value) for key, value in row.items()}
    if type(row) in (tuple, list):
        return type(row)(own(value) for value in row)
    return row


def row_tensors(row: Any) -> list[tuple[Any, torch.Tensor]]:
    """``(key, tensor)`` of each tensor at the top level of ``row``: a dict's values, a tuple's or list's items (keyed
    by position), or the row itself (key None)."""
    if isinstance(row, torch.Tensor):
        return [(None, row)]
    items = row.items() if isinstance(row, Mapping) else enumerate(row) if isinstance(row, (tuple, list)) else ()
    return [(key, value) for key, value in items if isinstance(value, torch.Tensor)]


def _watched(row: Any) -> tuple[Any, list[tuple[Any, torch.Tensor, int | None]]]:
    """``(row as the transform gets it, (key, tensor, its write count) of each tensor)``: a dict row, the common case,
    in one pass over its values; other rows by :func:`held_arrays` and :func:`row_tensors`."""
    if type(row) is not dict:
        row = held_arrays(row)
        return row, [(key, tensor, write_count(tensor)) for key, tensor in row_tensors(row)]
    given, watched = {}, []
    for key, value in row.items():
        if isinstance(value, torch.Tensor):
            watched.append((key, value, write_count(value)))
        elif isinstance(value, np.ndarray) and value.flags.writeable:
            value = value.copy()
        given[key] = value
    return given, watched


def write_count(tensor: torch.Tensor) -> int | None:
    """How often ``tensor``'s memory was written in place (torch's version counter, shared by its views); None for
    an inference-mode tensor, which keeps no count."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def same_memory(one: torch.Tensor, other: torch.Tensor) -> bool:
    return one.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()


class RowTransform:
    """A user's per-row transform bound to a split and the module's seed (see the module docstring for the rule).

    Args:
        transform: Any callable on one row (it must return the new row, not change the row in place: a write into
            a tensor the data holds is refused, and each writable numpy array of the row is handed as a copy).
        seed: The module's seed.
        role: The split it serves: 'train' reseeds each epoch; 'val', 'test' and 'predict' do not.
    """

    def __init__(self, transform: Callable[..., Any], *, seed: int, role: str) -> None:
        self.transform, self.seed, self.role = transform, seed, role
        self.argument = TRANSFORM_ARGUMENTS[role]
        self.uses_generator = takes_generator(transform)
        self.fresh_keys: set[Any] = set()
        """Keys whose tensors a transform wrote in place and a second read showed fresh (not the stored data's)."""

    def __copy__(self) -> RowTransform:
        """A copy (a mixture's source gets one with its own seed) that learns afresh which keys its rows make anew:
        another source may hand out the data's own tensors under the same key."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied.fresh_keys = set()
        return copied

    def row_seeds(self, epoch: int) -> Callable[[int], int]:
        """``index -> seed`` of the rows of ``epoch``: ``derive_seed(seed, "transform", "train", epoch, index)``
        for training, ``derive_seed(seed, "transform", split, index)`` (no epoch) for the other splits."""
        if self.role == "train":
            return seed_family(self.seed, "transform", "train", epoch)
        return seed_family(self.seed, "transform", self.role)

    def row_seed(self, index: int, epoch: int) -> int:
        """The seed of the row at dataset ``index`` in ``epoch`` (the epoch counts for training only)."""
        return self.row_seeds(epoch)(index)

    def __call__(self, rows: Sequence[Any], indices: Sequence[int], epoch: int,
                 reread: Callable[[int], Any] | None = None) -> list[Any]:
        """``rows`` (at dataset ``indices``) transformed; raises :class:`TransformFailed` naming a failing row.

        ``reread(i)`` reads row ``i`` of ``rows`` again from its source, untransformed: when the transform wrote
        into a tensor of a row in place, it tells a tensor the data holds (refused) from one made by this read."""
        seeds = self.row_seeds(epoch)
        context = contextlib.nullcontext() if self.uses_generator else global_rng_kept()
        with context:
            return [self._one(row, index, seeds(index), reread, place)
                    for place, (row, index) in enumerate(zip(rows, indices))]

    def _one(self, row: Any, index: int, seed: int, reread: Callable[[int], Any] | None = None, place: int = 0
             ) -> Any:
        row, watched = _watched(row)
        try:
            if self.uses_generator:
                out = self.transform(row, generator=generator_from(seed))
            else:
                seed_global_rng(seed)
                out = self.transform(row)
        except Exception as error:  # any exception of the user's code: named with the row by the source
            raise TransformFailed(index, error) from error
        if out is None:  # a bug of the transform, not a bad row: raised even under on_error='skip'
            raise TypeError(f"{self.argument} should return the row, but got None from {self.argument}(row) on row "
                            f"{index} of the {self.role} data; end the transform with `return row` (a transform "
                            f"that changes the row in place must still return it)")
        written = [(key, tensor) for key, tensor, count in watched
                   if count is not None and write_count(tensor) != count and key not in self.fresh_keys]
        if written and reread is not None:
            self._refuse_writes_into_the_data(written, dict(row_tensors(reread(place))), index)
        return out

    def _refuse_writes_into_the_data(self, written: list[tuple[Any, torch.Tensor]], again: dict[Any, torch.Tensor],
                                     index: int) -> None:
        """Refuse a write in place into a tensor the data holds (a second read of the row gives the same memory):
        every later read, and epoch, would see the changed values. A tensor each read makes afresh may be changed."""
        for key, tensor in written:
            if key not in again or not same_memory(again[key], tensor):
                self.fresh_keys.add(key)
                continue
            where = "the row" if key is None else f"row[{key!r}]"
            raise ValueError(
                f"{self.argument} should return new values and leave the row it is given as it is, but got "
                f"{self.argument}(row) changing {where} of row {index} of the {self.role} data in place; that tensor "
                f"is the data's own (a view of the stored rows), so every later read and epoch would see the "
                f"changed values. Assign a new tensor ({where} = {where} * 2, not {where}.mul_(2)), or clone it "
                f"before changing it in place ({where}.clone())")

    def __repr__(self) -> str:
        return f"RowTransform({self.transform!r}, role={self.role!r})"


def split_transforms(train_transform: Any, eval_transform: Any, *, seed: int,
                     stream: bool = False) -> dict[str, RowTransform]:
    """``{split: RowTransform}``: ``train_transform`` for the training rows, ``eval_transform`` for validation,
    test and prediction (also when they are cut from the training data by ``val_split``/``test_split``)."""
    check_transform("train_transform", train_transform)
    check_transform("eval_transform", eval_transform)
    if stream and train_transform is not None:
        raise ValueError("train_transform is seeded by each row's dataset index, which a stream "
                         "(datasets.IterableDataset) does not have; pass a map-style Dataset, or transform the "
                         "stream yourself (stream.map(...), not seeded by the module)")
    chosen = {"train": train_transform, "val": eval_transform, "test": eval_transform, "predict": eval_transform}
    return {role: RowTransform(transform, seed=seed, role=role) for role, transform in chosen.items()
            if transform is not None}
