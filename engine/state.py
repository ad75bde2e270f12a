"""The data module's checkpoint state: where the train loader stands, and fingerprints of the data it reads.

A state is only loaded into a module whose data, seed and splits match; otherwise a resumed run would
silently train on other rows, so loading raises and names what differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.rng import hash_into
from engine.sources import HFSource, MapSource, TorchSource

STATE_VERSION = 2
SAMPLED_ROWS = 16


def data_fingerprint(source: MapSource) -> str:
    """A fingerprint of the data, different whenever the data are replaced, reordered, grown or shrunk.

    Hugging Face data: ``datasets``' own fingerprint. Lists of tensors: a hash of evenly spaced rows. Other
    datasets: class, length and their ``fingerprint`` attribute if they define one. Their rows are not read,
    because ``__getitem__`` often augments at random and the same data must still resume.
    """
    digest = hashlib.blake2b(digest_size=12)
    count = len(source)
    digest.update(count.to_bytes(8, "little"))
    if isinstance(source, HFSource):
        digest.update(str(getattr(source.dataset, "_fingerprint", "")).encode())
    elif isinstance(source, TorchSource):
        dataset = source.dataset
        digest.update(f"{type(dataset).__module__}.{type(dataset).__qualname__}".encode())
        digest.update(repr(getattr(dataset, "fingerprint", "")).encode())
    else:
        positions = sorted({int(p) for p in np.linspace(0, count - 1, num=min(count, SAMPLED_ROWS))}) if count else []
        for position in positions:
            hash_into(digest, source[position])
    return digest.hexdigest()


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first field of ``saved`` that differs from ``current``."""
    if saved.get("version") != current["version"]:
        raise ValueError(
            f"the checkpoint's data state has version {saved.get('version')!r}, but this engine writes version "
            f"{current['version']}; it cannot be resumed exactly. Start a new run"
        )
    explanations = {
        "seed": "the seed decides the split, the order and every random choice",
        "data_fingerprint": "the training data differ (rows changed, reordered, added or removed)",
        "split_fingerprint": "the train/val/test split differs (val_split, test_split or the data changed)",
        "world_size": "the number of ranks differs, so each rank would read other rows",
        "num_workers": "torchdata resumes a loader's position only with the same number of worker processes",
    }
    for key, why in explanations.items():
        if saved.get(key) != current.get(key):
            raise ValueError(
                f"the checkpoint's data state does not match this data module: {key} was {saved.get(key)!r} when "
                f"saved and is {current.get(key)!r} now ({why}). Resume with the same data, seed, splits and "
                f"number of ranks, or start a new run"
            )
