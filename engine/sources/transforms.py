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
from collections.abc import Callable, Iterator, Sequence
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


class RowTransform:
    """A user's per-row transform bound to a split and the module's seed (see the module docstring for the rule).

    Args:
        transform: Any callable on one row (it must return the new row, not change the row in place).
        seed: The module's seed.
        role: The split it serves: 'train' reseeds each epoch; 'val', 'test' and 'predict' do not.
    """

    def __init__(self, transform: Callable[..., Any], *, seed: int, role: str) -> None:
        self.transform, self.seed, self.role = transform, seed, role
        self.argument = TRANSFORM_ARGUMENTS[role]
        self.uses_generator = takes_generator(transform)

    def row_seeds(self, epoch: int) -> Callable[[int], int]:
        """``index -> seed`` of the rows of ``epoch``: ``derive_seed(seed, "transform", "train", epoch, index)``
        for training, ``derive_seed(seed, "transform", split, index)`` (no epoch) for the other splits."""
        if self.role == "train":
            return seed_family(self.seed, "transform", "train", epoch)
        return seed_family(self.seed, "transform", self.role)

    def row_seed(self, index: int, epoch: int) -> int:
        """The seed of the row at dataset ``index`` in ``epoch`` (the epoch counts for training only)."""
        return self.row_seeds(epoch)(index)

    def __call__(self, rows: Sequence[Any], indices: Sequence[int], epoch: int) -> list[Any]:
        """``rows`` (at dataset ``indices``) transformed; raises :class:`TransformFailed` naming a failing row."""
        seeds = self.row_seeds(epoch)
        context = contextlib.nullcontext() if self.uses_generator else global_rng_kept()
        with context:
            return [self._one(row, index, seeds(index)) for row, index in zip(rows, indices)]

    def _one(self, row: Any, index: int, seed: int) -> Any:
        row = dict(row) if isinstance(row, dict) else row  # a transform that sets a key leaves the source's row be
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
        return out

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
