"""What happens to rows longer than ``max_length``: ``truncate`` (keep the start), ``split`` into consecutive windows
(with ``stride`` tokens of overlap, as transformers' ``return_overflowing_tokens``) or ``drop``; and a count of it.

The policy is applied at setup to each split's token data after the split is cut, so a document's windows never
land in two splits. Lists of tensors get new offsets into the same flat buffer; sharded data gets spans over its
corpus rows, cut as each batch is read; Hugging Face token columns are cut with a batched ``Dataset.map`` (``drop``
is a ``select`` view). Raw text tokenized here keeps its special tokens:
every window (and a truncated row) starts and ends with them, as the tokenizer's own overflow windows do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.core.checks import check_choice, check_int, keyword_or_spec
from engine.sources.lengths import lengths_of
from engine.sources.mixed import MixedSource
from engine.sources.rows import MapSource
from engine.sources.shards.source import ShardedSource
from engine.sources.wrappers import HFSource, TensorListSource

POLICIES = ("truncate", "split", "drop")


@dataclass(frozen=True)
class LongRows:
    """The policy for rows longer than ``max_length`` tokens (the collator's limit)."""

    policy: str = "truncate"
    """'truncate', 'split' or 'drop'."""
    max_length: int | None = None
    """The limit; None: no limit, nothing is long."""
    stride: int = 0
    """'split' only: tokens shared by consecutive windows."""

    @classmethod
    def resolve(cls, policy: str | None, stride: int | None, spec: Any, max_length: int | None) -> LongRows:
        """Each from its keyword or ``spec.preprocessing_config['long_rows' / 'stride']`` (refused when the two
        disagree), else 'truncate' and 0; checked now, so a mistake is reported at construction."""
        policy, _ = keyword_or_spec("long_rows", policy, spec, default="truncate")
        stride, _ = keyword_or_spec("stride", stride, spec, default=0)
        check_choice("long_rows", policy, POLICIES)
        stride = check_int("stride", stride, minimum=0)
        if stride and policy != "split":
            raise ValueError(f"stride={stride} is the overlap of the windows of long_rows='split', but long_rows="
                             f"{policy!r}; drop stride or pass long_rows='split'")
        if policy != "truncate" and max_length is None:
            raise ValueError(f"long_rows={policy!r} acts on rows longer than max_length, but max_length is None; "
                             f"set spec.max_seq_len (or collator_kwargs={{'max_length': ...}})")
        if max_length is not None and stride >= max_length:
            raise ValueError(f"stride should be smaller than max_length={max_length}, but got stride={stride}: "
                             f"each window must add new tokens")
        return cls(policy, max_length, stride)


def check_sources(given: dict[str, MapSource], stream: Any, policy: LongRows) -> None:
    """Refuse, at construction, data that ``policy`` cannot be applied to: 'split' and 'drop' need every row's
    length up front, which streams and torch datasets (read row by row) do not give (sharded data reads them from
    its token column alone)."""
    if policy.policy == "truncate":
        return
    if stream is not None:
        raise ValueError(f"long_rows={policy.policy!r} needs every row's length up front, which a stream "
                         f"(datasets.IterableDataset) does not have; use long_rows='truncate' or a map-style Dataset")
    for role, source in list(given.items()):
        if isinstance(source, MixedSource):  # each source of a mixture, named as it was given
            check_sources({f"{role}[{name!r}]": part for name, part in zip(source.names, source.sources)}, None,
                          policy)
            continue
        if role != "predict" and not isinstance(source, (HFSource, TensorListSource, ShardedSource)):
            raise TypeError(f"long_rows={policy.policy!r} needs token data in columns (a datasets.Dataset or a "
                            f"list of tensors), but {role}_data is a {type(source).__name__}; give one of those, "
                            f"or long_rows='truncate'")


def special_frame(tokenizer: Any) -> tuple[int, int]:
    """``(prefix, suffix)``: how many special tokens the tokenizer puts before and after a text's tokens."""
    with_special = list(tokenizer("a")["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start:start + len(plain)] == plain:
            return start, len(with_special) - start - len(plain)
    raise ValueError(f"cannot find where the tokenizer puts a text's tokens among its special tokens: "
                     f"{with_special} holds no {plain}")


def windows(lengths: np.ndarray, policy: LongRows, frame: tuple[int, int] = (0, 0)
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, start, end)`` of every output row: the kept part ``[start, end)`` of each row's text tokens (those
    between the ``frame``'s special tokens), which keeps its special tokens around it. Rows of at most
    ``max_length`` tokens pass whole; long ones are truncated, split or dropped by the policy."""
    prefix, suffix = frame
    lengths = np.asarray(lengths, dtype=np.int64)
    text = lengths - prefix - suffix
    if policy.max_length is None:
        rows = np.arange(len(lengths))
        return rows, np.zeros_like(text), text
    width = policy.max_length - prefix - suffix
    step = width - policy.stride
    if width < 1 or step < 1:
        raise ValueError(f"max_length={policy.max_length} leaves {width} text tokens per window besides the "
                         f"tokenizer's {prefix + suffix} special tokens, and stride={policy.stride}: each window "
                         f"must add new tokens; raise max_length or lower stride")
    long = lengths > policy.max_length
    if policy.policy == "drop":
        rows = np.flatnonzero(~long)
        return rows, np.zeros(len(rows), np.int64), text[rows]
    counts = np.ones(len(lengths), np.int64)
    if policy.policy == "split":
        counts[long] = 1 + np.ceil((text[long] - width) / step).astype(np.int64)
    rows = np.repeat(np.arange(len(lengths)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    starts = (np.arange(len(rows)) - first) * step
    ends = np.minimum(starts + width, text[rows])
    return rows, starts, ends


def count(lengths: np.ndarray, policy: LongRows, out_rows: int) -> dict[str, Any]:
    """What the policy did to rows of ``lengths``: rows and tokens in, long rows, tokens cut away, rows out."""
    lengths = np.asarray(lengths, dtype=np.int64)
    limit = policy.max_length if policy.max_length is not None else math.inf
    long = lengths > limit
    if policy.policy == "truncate":
        cut = int(np.maximum(lengths[long] - limit, 0).sum()) if long.any() else 0
    else:
        cut = int(lengths[long].sum()) if policy.policy == "drop" else 0
    return {"policy": policy.policy, "max_length": policy.max_length, "stride": policy.stride,
            "rows": int(len(lengths)), "long_rows": int(long.sum()), "tokens": int(lengths.sum()),
            "cut_tokens": cut, "out_rows": int(out_rows)}


def check_rows_left(report: dict[str, Any] | None, role: str) -> None:
    """Refuse a split that ``long_rows='drop'`` emptied: every row was longer than ``max_length``."""
    if report is None or report["policy"] != "drop" or not report["rows"] or report["out_rows"]:
        return
    raise ValueError(f"long_rows='drop' should leave rows in the {role} split, but it dropped all {report['rows']} "
                     f"of its rows: each is longer than max_length={report['max_length']} tokens; raise max_length "
                     f"(spec.max_seq_len, or collator_kwargs={{'max_length': ...}}), or pass long_rows='split' (keep "
                     f"them as windows) or long_rows='truncate' (keep their start)")


def describe(report: dict[str, Any], role: str = "train") -> str:
    """One line for ``repr(dm)`` and the setup log."""
    policy, long, rows = report["policy"], report["long_rows"], report["rows"]
    head = f"{long} of {rows} {role} rows are longer than max_length={report['max_length']}"
    share = report["cut_tokens"] / report["tokens"] if report["tokens"] else 0.0
    if policy == "truncate":
        return (f"{head}; truncating them drops {report['cut_tokens']} of {report['tokens']} tokens ({share:.1%}); "
                f"long_rows='split' keeps them")
    if policy == "drop":
        return (f"{head}; long_rows='drop' left them out ({report['cut_tokens']} of {report['tokens']} tokens, "
                f"{share:.1%})")
    return (f"{head}; long_rows='split' cut them into windows (stride={report['stride']}): "
            f"{report['out_rows']} rows now, no token lost")


def apply_long_rows(source: MapSource, key: str | None, policy: LongRows, frame: tuple[int, int] = (0, 0),
                    materialize: bool = False, whole: tuple[str, ...] = ()) -> tuple[MapSource, dict[str, Any] | None]:
    """``(source, report)``: ``source`` with the policy applied to its ``key`` token rows, and what it did.

    'truncate' leaves pre-tokenized rows whole (the collator keeps their start) unless ``materialize`` (raw text
    tokenized here: the cut keeps the special tokens). Columns named in ``whole`` (a seq2seq target) are copied
    to every window even when as long as the tokens. Sources whose lengths need a pass over every row (torch
    datasets) are returned as they are with no report (:func:`check_sources` refused 'split' and 'drop').
    """
    if not isinstance(source, (HFSource, TensorListSource, ShardedSource)):  # check_sources refused them
        return source, None
    if isinstance(source, ShardedSource) and policy.policy == "truncate":  # the collator cuts; a count would read
        return source, None  # every shard's token column before the first batch
    try:
        lengths = lengths_of(source, key)
    except (KeyError, TypeError):
        if policy.policy != "truncate":
            raise
        return source, None
    rows, starts, ends = windows(lengths, policy, frame)
    report = count(lengths, policy, len(rows))
    if not report["long_rows"] or (policy.policy == "truncate" and not materialize):
        return source, report
    if policy.policy == "drop":
        return source.view(rows), report
    if isinstance(source, ShardedSource):  # spans over the corpus rows, cut as each batch is read
        return source.windowed(rows, starts, ends, per_token_columns(source, key, lengths, whole)), report
    if isinstance(source, TensorListSource):
        cut: MapSource = TokenWindows(source, rows, starts, ends)
    else:
        cut = HFSource(cut_columns(source.dataset, key, (rows, starts, ends), frame, whole))
    cut.origins = np.asarray(source.user_indices(rows), dtype=np.int64)  # errors name the user's row, not a window
    return cut, report


class TokenWindows(TensorListSource):
    """Windows into a :class:`TensorListSource`'s flat buffer (1-D rows): new offsets, the tokens shared."""

    def __init__(self, source: TensorListSource, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        if source.shapes.shape[1] != 1:
            raise TypeError(f"long rows can be split only in 1-D token rows, but the rows have "
                            f"{source.shapes.shape[1]} dims")
        base = source.positions[rows] if source.positions is not None else rows
        self.key, self.buffer, self.positions = source.key, source.buffer, None
        self.starts = source.offsets[torch.as_tensor(base)] + torch.as_tensor(starts)
        self.shapes = torch.as_tensor(ends - starts, dtype=torch.long).reshape(-1, 1)

    def _row(self, index: int) -> torch.Tensor:
        start = int(self.starts[index])
        return self.buffer[start:start + int(self.shapes[index, 0])]

    def _spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.starts.numpy()[rows], self.shapes[:, 0].numpy()[rows]

    def view(self, positions: np.ndarray) -> TokenWindows:
        clone = object.__new__(TokenWindows)
        clone.__dict__.update(self.__dict__)
        clone.positions = self.positions[positions] if self.positions is not None else np.asarray(positions)
        return clone


class _CutRows:
    """A picklable batched ``map`` function: each output row is a window ``(row, start, end)`` of one input row;
    per-token columns are cut alike (keeping the frame's special tokens), other columns are copied."""

    def __init__(self, windows: tuple[np.ndarray, np.ndarray, np.ndarray], per_token: list[str],
                 frame: tuple[int, int]) -> None:
        self.windows, self.per_token, self.frame = windows, per_token, frame

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        rows, starts, ends = self.windows
        lo, hi = np.searchsorted(rows, indices[0], "left"), np.searchsorted(rows, indices[-1], "right")
        prefix, suffix = self.frame
        out: dict[str, list[Any]] = {name: [] for name in batch}
        for row, start, end in zip(rows[lo:hi].tolist(), starts[lo:hi].tolist(), ends[lo:hi].tolist()):
            for name, values in batch.items():
                value = values[row - indices[0]]
                if name in self.per_token:
                    value = value[:prefix] + value[prefix + start:prefix + end] + value[len(value) - suffix:]
                out[name].append(value)
        return out


def cut_columns(dataset: Any, key: str, windows: tuple[np.ndarray, np.ndarray, np.ndarray],
                frame: tuple[int, int], whole: tuple[str, ...] = ()) -> Any:
    """``dataset`` as its ``windows`` ``(rows, starts, ends)``, with a batched ``Dataset.map``: per-token columns
    (lists as long as ``key``'s in every row, except those in ``whole``) are cut, the others copied to each window
    of their row."""
    source = HFSource(dataset)
    per_token = per_token_columns(source, key, lengths_of(source, key), whole)
    return dataset.map(_CutRows(windows, per_token, frame), batched=True, with_indices=True,
                       remove_columns=dataset.column_names, features=dataset.features, desc="Cutting long rows")


def per_token_columns(source: MapSource, key: str, lengths: np.ndarray, whole: tuple[str, ...] = ()) -> list[str]:
    """The columns cut with the ``key`` tokens: ``key`` and the lists as long as its rows in every row (a mask,
    labels), except those in ``whole``."""
    return [name for name in source.column_names
            if name == key or (name not in whole and _same_lengths(source, name, lengths))]


def _same_lengths(source: MapSource, name: str, lengths: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(lengths_of(source, name), lengths))
    except (KeyError, TypeError):
        return False
