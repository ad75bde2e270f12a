"""Tokenization of raw-text columns with batched ``datasets.map``: once per machine and cached on disk for map-style
data (:mod:`engine.sources.tokenizing.token_cache`), lazily for streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.sources.inputs import needs_tokenizer, row_keys, text_fields, token_field
from engine.sources.media import encoded_images, media_columns, with_media_decoded
from engine.sources.rows import MapSource
from engine.sources.shards.source import ShardedSource
from engine.sources.shards.text import TextTokens
from engine.sources.tokenizing.token_cache import TokenCache
from engine.sources.wrappers import HFSource
from task_spec import TaskSpec


class TokenizeBatch:
    """The tokenize step of a batch of rows, ``{column: values}`` in, ``{token column: ids}`` out: the one step of
    :func:`tokenize_dataset` (``datasets.map``) and of :func:`~engine.sources.tokenizing.ray_tokenize.tokenize_on_ray`
    (Ray Data). Picklable, so ``datasets`` can fingerprint and cache its result and Ray can ship it to workers."""

    def __init__(self, tokenizer: Any, text_field: str, target_field: str | None, labels_key: str,
                 max_length: int | None, max_target_length: int | None) -> None:
        self.tokenizer = tokenizer
        self.text_field = text_field
        self.target_field = target_field
        self.labels_key = labels_key
        self.max_length = max_length
        self.max_target_length = max_target_length

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for column in (self.text_field, self.target_field):
            if column is not None and None in batch[column]:  # a stream's rows; map-style data is checked up front
                raise ValueError(f"{column!r} should be a string in every row of the stream, but got {column}=None "
                                 f"in a row; the tokenizer needs text in each row: filter those rows out "
                                 f"(stream.filter(lambda row: row[{column!r}] is not None)) or fill them")
        truncate = self.max_length is not None
        encoded = self.tokenizer(batch[self.text_field], truncation=truncate, max_length=self.max_length)
        out = {key: encoded[key] for key in ("input_ids", "attention_mask") if key in encoded}
        if self.target_field is not None:
            truncate = self.max_target_length is not None
            targets = self.tokenizer(text_target=batch[self.target_field], truncation=truncate,
                                     max_length=self.max_target_length)
            out[self.labels_key] = targets["input_ids"]
        return out


def tokenize_dataset(dataset: Any, spec: TaskSpec, tokenizer: Any, *, truncate: bool = True,
                     num_proc: int | None = None, cache_file_name: str | None = None) -> Any:
    """Return ``dataset`` with its raw text replaced by token ids (``input_ids``, ``attention_mask``,
    and ``labels`` from the target text for seq2seq). Other columns are kept.

    ``truncate=False`` keeps whole inputs (the long-row policy cuts them later, and counts what it cut);
    target text is always cut to ``max_target_len``. ``num_proc`` worker processes share the ``map``, which writes
    its result to ``cache_file_name`` (None: where ``datasets`` puts it, beside the data's own cache files)."""
    text_field, target_text = text_fields(spec)
    if target_text is not None and target_text not in dataset.column_names:
        target_text = None
    consumed = [c for c in (text_field, target_text) if c is not None]
    function = TokenizeBatch(
        tokenizer,
        text_field,
        target_text,
        spec.target_field or "labels",
        spec.max_seq_len if truncate else None,
        spec.additional_config.get("max_target_len"),
    )
    extra = {"desc": f"Tokenizing {text_field!r}", "num_proc": num_proc} if hasattr(dataset, "cache_files") else {}
    if cache_file_name is not None:
        extra["cache_file_name"] = cache_file_name
    return dataset.map(function, batched=True, remove_columns=consumed, **extra)  # streams: no desc, no num_proc


def tokenize_cached(dataset: Any, spec: TaskSpec, tokenizer: Any, cache: TokenCache) -> Any:
    """``dataset`` tokenized whole (no truncation), from ``cache`` when this data, tokenizer and these options were
    tokenized before on this machine; else tokenized now (with ``cache.num_proc`` processes) and saved there."""
    options = (*text_fields(spec), spec.target_field, spec.additional_config.get("max_target_len"))

    def build(scratch: Path) -> Any:
        data = dataset
        if (cache.num_proc or 1) > 1 and not dataset.cache_files:
            # Workers then memory-map the text rather than each receiving a pickled copy of its shard: the text is
            # held once, not once per worker, and nothing is pickled.
            data.save_to_disk(str(scratch))
            data = type(dataset).load_from_disk(str(scratch))
        # The map's file goes to the scratch folder, removed once the result is saved in the cache: not beside the
        # source's own cache files, where a second copy of the tokenized corpus would outlive the cache folder.
        scratch.mkdir(parents=True, exist_ok=True)
        return tokenize_dataset(data, spec, tokenizer, truncate=False, num_proc=cache.num_proc,
                                cache_file_name=str(scratch / "tokenized.arrow"))

    return cache.load_or_build(cache.path_for(dataset, tokenizer, options), build)


def has_raw_text(source: MapSource, spec: TaskSpec | None) -> bool:
    """Whether ``source`` is Hugging Face data whose raw text the module tokenizes."""
    return isinstance(source, HFSource) and spec is not None and needs_tokenizer(row_keys(source), spec, source)


def prepare_source(source: MapSource, spec: TaskSpec | None, tokenizer: Any, cache: TokenCache) -> MapSource:
    """Raw text becomes whole token ids, loaded from (or saved to) the on-disk ``cache``; image and audio columns
    of HF data come back as tensors (``Image`` columns as CHW uint8, ``Audio`` columns as float32 waveforms), so
    the collators see one layout whatever the storage. Other sources pass as is."""
    if isinstance(source, ShardedSource) and spec is not None and needs_tokenizer(row_keys(source), spec, source):
        source.text = TextTokens(tokenizer, text_fields(spec)[0])  # the collator tokenizes; lengths count tokens
        return source
    if not isinstance(source, HFSource) or spec is None:
        return source
    if has_raw_text(source, spec):
        source = HFSource(tokenize_cached(source.dataset, spec, tokenizer, cache))
    if spec.modality == "multimodal":  # images stay encoded: the collator decodes them, in the workers
        return HFSource(tensor_columns(encoded_images(source.dataset), spec))
    if spec.modality in ("vision", "audio"):
        return HFSource(tensor_columns(source.dataset, spec))
    return source


def tensor_columns(dataset: Any, spec: TaskSpec) -> Any:
    """``dataset`` whose spec fields come back as tensors: ``Image`` and ``Audio`` columns decoded by
    :func:`~engine.sources.media.with_media_decoded`, other columns by ``with_format('torch')``."""
    columns = [c for c in (*spec.input_fields, spec.target_field) if c in dataset.column_names]
    if media_columns(dataset, columns):
        return with_media_decoded(dataset, columns, spec.target_field)
    return dataset.with_format("torch", columns=columns, output_all_columns=True)


def prepare_stream(stream: Any, spec: TaskSpec | None, tokenizer: Any) -> Any:
    """The streaming twin of :func:`prepare_source`: tokenization and tensor formatting happen lazily."""
    if spec is None:
        return stream
    columns = stream.column_names or list(next(iter(stream)))
    text_field, _ = text_fields(spec)
    if spec.modality in ("text", "multimodal") and token_field(spec) not in columns and text_field in columns:
        return tokenize_dataset(stream, spec, tokenizer)
    if spec.modality in ("vision", "audio"):
        return stream.with_format("torch")
    return stream
