"""Raw text in shards: the token count of every row, for the length-aware batching modes.

The collator tokenizes a batch's text as it comes (``plain`` batching needs nothing more). ``grouped``,
``token_budget`` and ``packed`` batching sort and pack rows by their token counts before any batch, so those are
counted once here: each row group's text column alone is read (a ranged read of that column) and tokenized as the
collator tokenizes it (special tokens added, no truncation: the samplers and the collator cut to ``max_length``),
and the counts are kept beside the cache, named by the corpus's fingerprint, the column and the tokenizer, so a
resumed run, and the other ranks of the machine, count nothing again.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from engine.sources.shards.decode import save_array


class TextTokens(NamedTuple):
    """How a sharded corpus's raw text becomes tokens: the module's ``tokenizer`` on column ``text_field``."""

    tokenizer: Any
    text_field: str


def tokenizer_hash(tokenizer: Any) -> str:
    """A name of ``tokenizer``'s vocabulary and settings: ``datasets``' hash of it, as the token cache uses."""
    from datasets.fingerprint import Hasher

    return hashlib.blake2b(Hasher.hash(tokenizer).encode(), digest_size=8).hexdigest()


def text_lengths(reader: Any, text: TextTokens, saved: Any) -> np.ndarray:
    """The token count of every corpus row's ``text.text_field`` (int64, in corpus order), read from ``saved`` (a
    ``.npy`` path) when counted before, else counted row group by row group and saved there."""
    if saved.exists():
        return np.load(saved).astype(np.int64)

    def count(group: int) -> np.ndarray:
        texts = reader.column(group, text.text_field).to_pylist()
        for row, value in enumerate(texts):
            if not isinstance(value, str):
                shard = int(reader.listing.group_shard[group])
                raise TypeError(
                    f"row {row} of row group {int(reader.listing.group_index[group])} of shard "
                    f"{reader.listing.url(shard)!r}: {text.text_field!r} should hold a str of raw text, but got "
                    f"{type(value).__name__} {value!r:.60}; filter those rows out of the shards, or fill them")
        encoded = text.tokenizer(texts, add_special_tokens=True, return_attention_mask=False,
                                 return_token_type_ids=False)["input_ids"]
        return np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))

    with ThreadPoolExecutor(max_workers=4) as pool:  # the reads overlap; the tokenizer runs in its own threads
        parts = list(pool.map(count, range(reader.listing.num_groups)))
    lengths = np.concatenate(parts) if parts else np.empty(0, np.int64)
    save_array(saved, lengths.astype(np.int32 if len(lengths) and lengths.max() < 2**31 else np.int64))
    return lengths
