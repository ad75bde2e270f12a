"""What a module was given: each role's data adapted to a source and checked against the spec at construction
(:func:`take_inputs`, before any data is read in bulk, so a mistake is reported at the call that made it), then
tokenized, fingerprinted and split at setup (:func:`prepare_inputs`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from engine.datamodule.options import check_data_arguments
from engine.loading.state import data_fingerprint
from engine.sources.adapt import as_source
from engine.sources.inputs import check_inputs, needs_tokenizer, row_keys, token_field
from engine.sources.kinds import is_hf_dataset_dict, unpack_dataset_dict
from engine.sources.lengths import check_no_empty_rows
from engine.sources.long_rows import LongRows, apply_long_rows, check_rows_left, describe, special_frame
from engine.sources.mixed import MixedSource
from engine.sources.protocol import Source
from engine.sources.rows import MapSource
from engine.sources.splits import SplitPlan, mixed_plan, plan_splits, split_labels, split_views
from engine.sources.streams import EpochStream, check_stream_options, is_hf_stream, peek_rows, stream_fingerprint
from engine.sources.targets import check_split_targets
from engine.sources.tokenizing.preprocess import has_raw_text, prepare_source, prepare_stream
from engine.sources.tokenizing.token_cache import TokenCache, machine_first
from engine.sources.transforms import RowTransform
from engine.sources.wrappers import TorchSource
from task_spec import TaskSpec

ROLES = ("train", "val", "test", "predict")


def take_inputs(train_data: Any, *, val_data: Any, test_data: Any, predict_data: Any, task_spec: Any,
                tokenizer: Any, val_split: float | int, test_split: float | int, shuffle: bool | None, seed: int,
                on_error: str = "raise") -> tuple[dict[str, MapSource], Any]:
    """``(sources by role, stream or None)``: the data adapted and checked; a stream's train entry is a peek.

    A ``DatasetDict`` is unpacked into its splits; a ``datasets.IterableDataset`` is kept aside as the stream
    (its first row is checked here, the stream itself is wrapped at setup).
    """
    if task_spec is not None and not isinstance(task_spec, TaskSpec):
        raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
    if is_hf_dataset_dict(train_data):
        train_data, val_data, test_data = unpack_dataset_dict(train_data, val_data, test_data)
    check_data_arguments(has_train=train_data is not None, has_predict=predict_data is not None,
                         val_data=val_data, test_data=test_data, val_split=val_split, test_split=test_split)
    stream = train_data if is_hf_stream(train_data) else None
    if stream is not None:
        check_stream_options(val_split=val_split, test_split=test_split, shuffle=shuffle)
        train_data = None
    key = task_spec.input_fields[0] if task_spec is not None else None
    given = {role: as_source(data, key=key, spec=task_spec, what=f"{role}_data", on_error=on_error)
             for role, data in zip(ROLES, (train_data, val_data, test_data, predict_data)) if data is not None}
    if stream is not None:
        given["train"] = TorchSource(peek_rows(stream, 1))  # checked below, replaced at setup
    for role, source in given.items():
        check_inputs(source, task_spec, tokenizer, f"{role}_data", require_target=role != "predict")
    if train_data is not None:  # validates the split arguments now, before any work
        for name, part in given["train"].parts():  # a mixture's sources each on their own, named in errors
            with source_named(name, "; val_split and test_split cut each source of a mixture on its own: give a "
                                    "fraction, or a count below the smallest source's rows") \
                    if name is not None else contextlib.nullcontext():
                plan_splits(len(part), val_split=val_split, test_split=test_split, seed=seed)
    return given, stream


def take_mixture(train_data: Mapping[str, Any], names: tuple[str, ...], *, task_spec: Any, tokenizer: Any,
                 on_error: str) -> MixedSource:
    """The named sources of a mixture, each adapted and checked as train data, as one :class:`MixedSource` in
    the order of the mixture's ``names``."""
    if set(train_data) != set(names):
        missing, extra = sorted(set(names) - set(train_data)), sorted(set(train_data) - set(names))
        raise KeyError(f"mix should weigh every source of train_data {sorted(train_data)} and no other; sources "
                       f"without a weight: {extra}, weights without a source: {missing}")
    key = task_spec.input_fields[0] if task_spec is not None else None
    parts = {}
    for name in names:
        data = train_data[name]
        if is_hf_stream(data) or is_hf_dataset_dict(data):
            raise TypeError(f"train_data[{name!r}] is a {type(data).__name__}; a mixture's sources are map-style "
                            f"data (a datasets.Dataset, a torch Dataset, a list of tensors, Shards...): pass one "
                            f"split, e.g. dataset_dict['train']")
        parts[name] = as_source(data, key=key, spec=task_spec, what=f"train_data[{name!r}]", on_error=on_error)
        check_inputs(parts[name], task_spec, tokenizer, f"train_data[{name!r}]")
    check_tokenized_alike(parts, task_spec)
    if not any(has_raw_text(part, task_spec) for part in parts.values()):  # raw text: compared once tokenized
        check_same_fields(parts)
    return MixedSource(parts)


def check_tokenized_alike(parts: Mapping[str, MapSource], task_spec: Any) -> None:
    """Refuse a mixture where the collator would tokenize some sources' raw text batch by batch (a torch dataset's,
    a user's source's, shards') while the others reach it as token ids (pre-tokenized, or a ``datasets.Dataset``'s
    raw text, tokenized at setup): a batch mixes their rows, which must have the same fields."""
    if task_spec is None:
        return
    by_collator = [name for name, part in parts.items()
                   if not has_raw_text(part, task_spec) and needs_tokenizer(row_keys(part), task_spec, part)]
    ahead = [name for name in parts if name not in by_collator]
    if by_collator and ahead:
        raise ValueError(
            f"a mixture's sources should reach the collator alike, since every batch mixes their rows, but the raw "
            f"text of train_data[{by_collator[0]!r}] would be tokenized batch by batch by the collator while "
            f"train_data[{ahead[0]!r}] holds token ids (or is a datasets.Dataset whose text is tokenized at setup); "
            f"give train_data[{by_collator[0]!r}] as a datasets.Dataset (datasets.Dataset.from_list(rows)), which is "
            f"tokenized at setup like the others, or tokenize it ahead (tokenize_on_ray for shards)")


IMAGE_ROW_FIELDS = ("image", "images")
"""The fields of an image-text row that a text-only row lacks: a mixture may mix such rows (the multimodal collator
takes rows with and without images), as it may rows with and without metadata fields named ``__...__``."""


def _compared(keys: list[str] | None) -> list[str] | None:
    return None if keys is None else sorted(key for key in keys
                                            if key not in IMAGE_ROW_FIELDS and not key.startswith("__"))


def check_same_fields(parts: Mapping[str, MapSource]) -> None:
    """Refuse a mixture whose sources' rows have other fields: a batch mixes their rows, which must be alike (but
    for images and ``__key__``-like metadata: image-text and text-only sources mix)."""
    fields = {name: row_keys(part) for name, part in parts.items()}
    first, keys = next(iter(fields.items()))
    for name, other in fields.items():
        if other is not None and keys is not None and _compared(other) != _compared(keys):
            missing, extra = sorted(set(keys) - set(other)), sorted(set(other) - set(keys))
            raise ValueError(f"a mixture's sources should have the same fields, since every batch mixes their rows, "
                             f"but train_data[{name!r}] has {sorted(other)} and train_data[{first!r}] has "
                             f"{sorted(keys)} (missing {missing}, extra {extra}); drop or add the columns so they "
                             f"match (e.g. dataset.remove_columns({extra or missing}))")


def prepare_inputs(given: dict[str, MapSource], stream: Any, task_spec: Any, tokenizer: Any, *,
                   val_split: float | int, test_split: float | int, seed: int, rank: int, world_size: int,
                   long_rows: LongRows | None = None, cache: TokenCache | None = None,
                   transforms: Mapping[str, RowTransform | None] | None = None, stratify: bool = False) -> Prepared:
    """Raw text tokenized once per machine (cached), the train data split by document, then the long-row policy
    applied to each split, so that no document's windows land in two splits. None: truncation, default cache.
    Each split is its own copy of the source (views cut by ``val_split`` included) with its ``transforms[role]``."""
    long_rows, cache = long_rows or LongRows(), cache or TokenCache()
    if "train" in given and is_mixture(given["train"]):
        return _prepare_mixture(given, task_spec, tokenizer, val_split=val_split, test_split=test_split, seed=seed,
                                rank=rank, world_size=world_size, long_rows=long_rows, cache=cache,
                                transforms=transforms)
    raw = {role for role, source in given.items() if has_raw_text(source, task_spec)}
    with machine_first() if raw else contextlib.nullcontext():  # local rank 0 tokenizes, the others load
        sources = {role: prepare_source(source, task_spec, tokenizer, cache) for role, source in given.items()}
    if stream is not None:
        train = EpochStream(prepare_stream(stream, task_spec, tokenizer), rank=rank, world_size=world_size)
        others = {role: source for role, source in sources.items() if role != "train"}
        return Prepared({**_for_roles(others, transforms), "train": train}, stream_fingerprint(stream), None, {})
    plan = fingerprint = None
    if "train" in sources:
        labels = split_labels(sources["train"], task_spec) if stratify else None
        plan = plan_splits(len(sources["train"]), val_split=val_split, test_split=test_split, seed=seed, labels=labels)
        sources.update(split_views(sources["train"], plan, val=bool(val_split), test=bool(test_split)))
        fingerprint = data_fingerprint(given["train"])
    for role, source in sources.items():  # before any batch: a missing or non-finite target in a column
        check_split_targets(source, task_spec, role, transformed=(transforms or {}).get(role) is not None)
        if long_rows.policy != "truncate":  # other rows: a saved position must not be resumed on them
            fingerprint = hashlib.blake2b(f"{fingerprint}{long_rows}".encode(), digest_size=12).hexdigest()
    key = token_field(task_spec) if task_spec is not None else None
    frame = special_frame(tokenizer) if raw else (0, 0)
    whole = (task_spec.target_field,) if task_spec is not None and task_spec.task_type == "seq2seq" else ()
    from_train = {role for role, cut in (("val", val_split), ("test", test_split)) if cut and "train" in raw}
    reports = {}
    for role in list(sources):
        from_text = role in raw | from_train
        if task_spec is not None and task_spec.modality == "text":
            check_no_empty_rows(sources[role], key, role)
        policy = long_rows if role != "predict" else LongRows("truncate", long_rows.max_length)  # one per row
        sources[role], reports[role] = apply_long_rows(sources[role], key, policy, frame if from_text else (0, 0),
                                                       materialize=from_text, whole=whole)
        check_rows_left(reports[role], role)
    return Prepared(_for_roles(sources, transforms), fingerprint, plan,
                    {role: r for role, r in reports.items() if r is not None})


def _prepare_mixture(given: dict[str, MapSource], task_spec: Any, tokenizer: Any, *, val_split: float | int,
                     test_split: float | int, seed: int, rank: int, world_size: int, long_rows: LongRows,
                     cache: TokenCache, transforms: Mapping[str, RowTransform | None] | None) -> Prepared:
    """Each source of a mixture prepared as train data on its own (tokenized, split by ``val_split``/``test_split``,
    long rows), then each split's parts laid end to end; the other splits given are prepared as usual."""
    mixed = given["train"]
    common = {"task_spec": task_spec, "tokenizer": tokenizer, "seed": seed, "rank": rank, "world_size": world_size,
              "long_rows": long_rows, "cache": cache, "transforms": transforms}
    parts = {}
    for name, part in zip(mixed.names, mixed.sources):
        with source_named(name):
            parts[name] = prepare_inputs({"train": part}, None, val_split=val_split, test_split=test_split, **common)
    raw = [name for name, part in zip(mixed.names, mixed.sources) if has_raw_text(part, task_spec)]
    parts = _tokenized_like_the_others(parts, raw)
    check_same_fields({name: part.sources["train"] for name, part in parts.items()})  # raw text now tokenized
    others = {role: source for role, source in given.items() if role != "train"}
    prepared = prepare_inputs(others, None, val_split=0, test_split=0, **common) if others else None
    sources = dict(prepared.sources) if prepared is not None else {}
    for role in ("train", "val", "test"):
        if all(role in part.sources for part in parts.values()):
            mixed_role = MixedSource({name: part.sources[role] for name, part in parts.items()})
            sources[role] = mixed_role.for_role(role, (transforms or {}).get(role))
    reports = dict(prepared.long_rows) if prepared is not None else {}
    reports.update({f"{role} {name!r}": report for name, part in parts.items()
                    for role, report in part.long_rows.items()})
    plan = mixed_plan({name: part.plan for name, part in parts.items()})  # a checkpoint's splits are checked too
    return Prepared(sources, {name: part.fingerprint for name, part in parts.items()}, plan, reports)


@contextlib.contextmanager
def source_named(name: str, fix: str = "") -> Iterator[None]:
    """A ValueError raised while one source of a mixture is checked or prepared, naming that source (each is
    prepared as train data on its own, so the error itself says only "the train data"), and ``fix`` after it."""
    try:
        yield
    except ValueError as error:
        raise ValueError(f"mixture source train_data[{name!r}]: {error}{fix}") from error


def _tokenized_like_the_others(parts: dict[str, Prepared], raw: list[str]) -> dict[str, Prepared]:
    """A mixture's raw-text sources, tokenized, without the ``attention_mask`` the tokenizer added when the
    pre-tokenized sources have none: a row's mask is all ones before padding, and the collator masks the padding
    of every row alike, so the batches are the same, and the sources have the same fields."""
    given = [name for name in parts if name not in raw]
    if not raw or not given or any("attention_mask" in (row_keys(parts[name].sources["train"]) or ())
                                   for name in given):
        return parts
    out = dict(parts)
    for name in raw:
        sources = parts[name].sources
        if all("attention_mask" in (row_keys(source) or ()) for source in sources.values()):  # tokenized: Arrow
            out[name] = parts[name]._replace(sources={role: source.without_columns(["attention_mask"])
                                                      for role, source in sources.items()})
    return out


def is_mixture(source: Source) -> bool:
    """Whether ``source`` is a mixture: made of named sources (:meth:`~engine.sources.protocol.Source.parts`)."""
    return source.parts()[0][0] is not None


def _for_roles(sources: dict[str, MapSource], transforms: Mapping[str, Any] | None) -> dict[str, MapSource]:
    """Each source as its own copy serving its split (named in errors) with that split's transform."""
    return {role: source.for_role(role, (transforms or {}).get(role)) for role, source in sources.items()}


def prepare_tokens(given: dict[str, MapSource], task_spec: Any, tokenizer: Any, cache: TokenCache) -> None:
    """Tokenize each raw-text source into the on-disk cache (``prepare_data``: Lightning runs it on each
    machine's local rank 0), so that setup on every rank only loads it."""
    for source in given.values():
        for _, part in source.parts():
            if has_raw_text(part, task_spec):
                prepare_source(part, task_spec, tokenizer, cache)


class Prepared(NamedTuple):
    """What :func:`prepare_inputs` made: the sources by role, the data fingerprint, the split plan, and per role
    what the long-row policy did (:func:`engine.sources.long_rows.count`)."""

    sources: dict[str, Any]
    fingerprint: str | dict[str, str | None] | None
    """The train data's fingerprint; a mixture's: one per source, by name."""
    plan: SplitPlan | None
    long_rows: dict[str, dict[str, Any]]


def log_long_rows(reports: dict[str, dict[str, Any]]) -> dict[str, int] | None:
    """Say once in the log what the long-row policy did to each split that has long rows (never silent), and
    return the train split's counts as ``{rows, long_rows, tokens, lost_tokens}`` (``dm.truncation``)."""
    lines = [describe(report, role) for role, report in reports.items() if report["long_rows"]]
    if lines:
        logging.getLogger("engine").warning("; ".join(lines))
    train = reports.get("train")
    if train is None:
        return None
    return {"rows": train["rows"], "long_rows": train["long_rows"], "tokens": train["tokens"],
            "lost_tokens": train["cut_tokens"]}
