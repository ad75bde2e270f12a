"""Turning the rows a text collator receives into flat tensors: ids, per-token keys, labels and extra keys.

Every function here copies: nothing returned shares memory with the caller's rows, and rows are never changed.
Errors name the first bad row, the key, what was expected, what was found and the fix.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from collators.targets import NULL_HINT, row_name

IDS_EXPECTED = "a 1-D sequence of int token ids (list, tuple, 1-D integer tensor or 1-D integer numpy array)"


def as_mapping_rows(rows: Any, target_keys: Sequence[str] = ()) -> list[Mapping[str, Any]]:
    """Rows as mappings: a bare id sequence becomes ``{'input_ids': row}``; all rows must share their keys.

    A batch may lack its targets (prediction), but not in some rows only: that error names ``target_keys``.
    """
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise TypeError(
            f"rows should be a list of rows (dicts, or sequences of token ids), but got {type(rows).__name__}; "
            f"a dict of columns must be split into one dict per row first"
        )
    if not rows:
        raise ValueError("rows should hold at least one row, but got an empty list (an empty batch)")
    out: list[Mapping[str, Any]] = []
    for index, row in enumerate(rows):
        if isinstance(row, Mapping):
            out.append(row)
        elif isinstance(row, (list, tuple, torch.Tensor, np.ndarray)):
            out.append({"input_ids": row})
        else:
            raise TypeError(
                f"row {index} should be a dict or {IDS_EXPECTED}, but got {type(row).__name__}: {row!r:.80}; "
                f"wrap raw text as {{'text': ...}} and pass tokenizer=..."
            )
    keys = out[0].keys()
    for index, row in enumerate(out):
        if row.keys() != keys:
            missing, extra = sorted(set(keys) - set(row)), sorted(set(row) - set(keys))
            if set(missing + extra) <= set(target_keys):
                key = (missing + extra)[0]
                lacking, having = (index, 0) if missing else (0, index)
                raise mixed_targets_error(key, lacking, having)
            raise ValueError(
                f"row {index} has keys {sorted(row)} but row 0 has {sorted(keys)} (missing: {missing}, extra: "
                f"{extra}); every row of a batch should carry the same keys"
            )
    return out


def mixed_targets_error(key: str, lacking: int, having: int) -> ValueError:
    return ValueError(
        f"row {lacking} has no target under {key!r} but row {having} has one; give every row of a batch its "
        f"target (training, evaluation), or none (prediction: the batch then has no {key!r})"
    )


def column(rows: Sequence[Mapping[str, Any]], key: str) -> list[Any]:
    """The values of ``key`` in every row (rows share keys, checked by :func:`as_mapping_rows`)."""
    return [row[key] for row in rows]


def _is_int_dtype(dtype: torch.dtype, allow_bool: bool) -> bool:
    if dtype == torch.bool:
        return allow_bool
    return not (dtype.is_floating_point or dtype.is_complex)


BOOL_FIX = (
    "bools are not token ids: if they are meant as 0/1 ids convert them with .long() (tensor), .astype(np.int64) "
    "(numpy) or [int(x) for x in row] (list); a boolean mask belongs under 'attention_mask'"
)


def _problem(value: Any, allow_bool: bool) -> tuple[str, bool] | None:
    """Why ``value`` is not a valid 1-D id row (and whether the reason is bools), or None if it is valid."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            return f"a {value.dim()}-D tensor of shape {tuple(value.shape)}", False
        return None if _is_int_dtype(value.dtype, allow_bool) else (f"a tensor of dtype {value.dtype}",
                                                                   value.dtype == torch.bool)
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            return f"a {value.ndim}-D numpy array of shape {value.shape}", False
        ok = value.dtype.kind in ("iu" + ("b" if allow_bool else ""))
        return None if ok else (f"a numpy array of dtype {value.dtype}", value.dtype.kind == "b")
    if isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            if isinstance(item, (bool, np.bool_)) and not allow_bool:
                return f"a {type(value).__name__} whose item {position} is {type(item).__name__} {item!r}", True
            if not isinstance(item, (int, np.integer, bool, np.bool_)):
                return f"a {type(value).__name__} whose item {position} is {type(item).__name__} {item!r:.40}", False
        return None
    return f"{type(value).__name__} {value!r:.60}", False


def _raise_first_bad(values: Sequence[Any], key: str, allow_bool: bool) -> None:
    for index, value in enumerate(values):
        found = _problem(value, allow_bool)
        if found is not None:
            what, is_bool = found
            fix = BOOL_FIX if is_bool else "convert it to a flat list of ints"
            raise TypeError(f"row {index}: {key!r} should be {IDS_EXPECTED}, but got {what}; {fix}")


def _refuse_hidden_bools(items: list[Any], array: np.ndarray, values: Sequence[Any], key: str) -> None:
    """Raise if a Python/numpy bool hides among ints (numpy converts ``[5, True]`` to int64 without a trace).

    A bool becomes 0 or 1, so only those elements are looked at: few in token ids, so this costs one vectorized
    comparison per batch; label columns full of 0/1 take one C-level pass over the types of those elements.
    """
    zero_one = (array >= 0) & (array <= 1)
    count = int(np.count_nonzero(zero_one))
    if count == 0:
        return
    if count > len(items) // 4:
        picked = items  # mostly 0/1 (a label-like column): one pass over all types beats picking them out
    else:
        suspects = np.flatnonzero(zero_one).tolist()
        picked = [items[suspects[0]]] if count == 1 else operator.itemgetter(*suspects)(items)
    types = set(map(type, picked))
    if bool not in types and np.bool_ not in types:
        return
    position = next(p for p in np.flatnonzero(zero_one).tolist() if isinstance(items[p], (bool, np.bool_)))
    ends = np.cumsum([len(value) for value in values])
    row = int(np.searchsorted(ends, position, side="right"))
    within = position - (int(ends[row - 1]) if row else 0)
    raise TypeError(
        f"row {row}: {key!r} should be {IDS_EXPECTED}, but got a {type(values[row]).__name__} whose item {within} "
        f"is {type(items[position]).__name__} {items[position]!r}; {BOOL_FIX}"
    )


def _row_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.astype(np.int64, copy=False))
    return torch.tensor(value, dtype=torch.long).reshape(-1)


def flatten_ids(values: Sequence[Any], key: str, *, allow_bool: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate per-row id sequences into one new int64 tensor; return it with each row's length.

    Lists are converted in one ``np.array`` call, tensors in one ``torch.cat``, numpy arrays in one
    ``np.concatenate``; a batch mixing these converts row by row.
    """
    if all(isinstance(value, (list, tuple)) for value in values):
        if allow_bool:
            small = _small_ints(values)
            if small is not None:
                return small
        # One inferring numpy conversion (one C pass over the chained list, not one per row) that also reveals
        # floats, strings, None or nesting through the dtype and shape it infers.
        items = list(itertools.chain.from_iterable(values))
        try:
            array = np.array(items)
        except (TypeError, ValueError, OverflowError):
            array = None
        if array is not None and array.size == 0:
            array = np.empty(0, dtype=np.int64)
        if array is None or array.ndim != 1 or array.dtype.kind not in ("iub" if allow_bool else "iu"):
            _raise_first_bad(values, key, allow_bool)
            raise TypeError(f"{key!r} should be {IDS_EXPECTED}; the rows could not be converted together")
        if not allow_bool:
            _refuse_hidden_bools(items, array, values, key)
        flat = torch.from_numpy(array.astype(np.int64, copy=False))
    else:
        _raise_first_bad(values, key, allow_bool)
        if all(isinstance(value, np.ndarray) for value in values):
            flat = torch.from_numpy(np.concatenate(values).astype(np.int64, copy=False))
        else:  # torch.cat always allocates, so the result never aliases a row's tensor
            flat = torch.cat([_row_tensor(value).to(torch.long) for value in values])
    lengths = torch.tensor([len(value) for value in values], dtype=torch.long)
    return flat.to(torch.long), lengths


def _small_ints(values: Sequence[Sequence[Any]]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Masks of 0/1 (ints or bools) converted through ``bytes``: a C copy per row, with no dtype to infer.

    ``bytes`` takes exactly ints (and bools, and numpy ints) in [0, 256); anything else (floats, None, strings,
    nesting, other ints) makes it raise, and the caller then takes the general path with its checks and errors.
    """
    try:
        joined = b"".join(map(bytes, values))
    except (TypeError, ValueError):
        return None
    flat = torch.from_numpy(np.frombuffer(joined, dtype=np.uint8).astype(np.int64))
    return flat, torch.tensor([len(value) for value in values], dtype=torch.long)


def check_same_lengths(lengths: torch.Tensor, reference: torch.Tensor, key: str, reference_key: str) -> None:
    """Raise at the first row whose ``key`` does not have one entry per token of ``reference_key``."""
    if torch.equal(lengths, reference):  # the common case, one call
        return
    differ = (lengths != reference).nonzero()
    if len(differ):
        index = int(differ[0])
        raise ValueError(
            f"row {index}: {key!r} has {int(lengths[index])} entries but {reference_key!r} has "
            f"{int(reference[index])}; {key!r} needs one entry per token, aligned with {reference_key!r}"
        )


def tokenize_column(tokenizer: Any, texts: Sequence[Any], key: str, *, max_length: int | None,
                    target: bool, ids_key: str, rows: Any = None) -> list[list[int]]:
    """Tokenize the raw ``texts`` of ``key`` in one batched call (special tokens added, truncated to ``max_length``).

    A text that is not a str is refused before the tokenizer sees it, naming its row as ``rows`` (the batch as the
    collator got it) knows it: its split and index in the data given (:func:`collators.targets.row_name`)."""
    texts = list(texts)
    if tokenizer is None:
        raise ValueError(
            f"rows hold raw text under {key!r} but no tokenizer was given; pass tokenizer=... to the collator "
            f"(or UniversalDataModule(tokenizer=...)) or give token ids under {ids_key!r}"
        )
    for index, text in enumerate(texts):
        if text is None:
            raise ValueError(
                f"{row_name(rows, index)}: {key!r} should hold a str of raw text, but got None ({NULL_HINT}); "
                f"filter the rows without text out of the data, or fill them"
            )
        if not isinstance(text, str):
            raise TypeError(
                f"{row_name(rows, index)}: {key!r} should hold a str of raw text, but got {type(text).__name__} "
                f"{text!r:.60}; give token ids under {ids_key!r} instead"
            )
    texts_kwarg = {"text_target" if target else "text": texts}
    encoded = tokenizer(**texts_kwarg, add_special_tokens=True, truncation=max_length is not None,
                        max_length=max_length, return_attention_mask=False, return_token_type_ids=False)
    return encoded["input_ids"]
