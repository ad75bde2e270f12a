"""OwnGenerator: a collator's own ``torch.Generator``, picklable for spawned and forkserver loader workers."""

from __future__ import annotations

from typing import Any

import torch


class OwnGenerator:
    """Base of collators that keep their own generator in ``_generator`` (drawn from when a call gets none).

    The generator pickles as its state's bytes. torch pickles a ``Generator`` with its state as a tensor, which
    ``torch.multiprocessing`` hands to a spawned or forkserver worker as the descriptor of a shared-memory block;
    that tensor is freed once pickled, so the descriptor is closed before the worker opens it and the worker dies
    ("unable to resize file"). A worker gets the generator in the state it had, as a forked worker does.
    """

    _generator: torch.Generator

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_generator": self._generator.get_state().numpy().tobytes()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        generator = torch.Generator()
        generator.set_state(torch.frombuffer(bytearray(state["_generator"]), dtype=torch.uint8))
        self.__dict__.update(state, _generator=generator)
