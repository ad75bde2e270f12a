"""A mixture's orders are pinned: the same declaration, sizes, lengths and seed give the same rows in the same
positions, whichever way the engine computes them (a checkpoint resumes onto the rows it was saved on)."""

import hashlib

import numpy as np
import pytest

from engine import Mixture
from engine.sampling.mixtures.order import MixtureOrder

WEIGHTS = {"a": 5, "b": 3, "c": 2}
CASES = {
    "by tokens, switched": (dict(by="tokens", schedule=[(40, {"a": 1, "b": 1, "c": 6})]), "9312e12dbc429e37"),
    "by tokens, ramped then switched": (dict(by="tokens", schedule=[(20, {"a": 0, "b": 2, "c": 1}, "linear"),
                                                                    (90, {"a": 1, "b": 1, "c": 1})]),
                                        "0814be00ee7c6198"),
    "by tokens, a source that stops and one capped": (
        dict(by="tokens", exhaust={"a": "cycle", "b": "stop", "c": 2},
             schedule=[(30, {"a": 1, "b": 4, "c": 1}, "linear")]), "f7a645fa30e947a2"),
    "by tokens, samples_per_epoch": (dict(by="tokens", samples_per_epoch=777,
                                          schedule=[(25, {"a": 0, "b": 0, "c": 1})]), "71cae7236cf9162d"),
    "by tokens, constant": (dict(by="tokens"), "50e69dedb7121702"),
    "by rows, ramped": (dict(by="rows", schedule=[(50, {"a": 1, "b": 1, "c": 6}, "linear")]), "748c3577ef16038e"),
    "by rows, two ramps, a source that stops and one capped, no lengths": (
        dict(by="rows", exhaust={"a": "cycle", "b": "stop", "c": 2},
             schedule=[(10, {"a": 0, "b": 1, "c": 1}, "linear"), (40, {"a": 3, "b": 0.1, "c": 1}, "linear")]),
        "f986cfb42c6e9836"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_three_epochs_of_a_mixture_are_the_pinned_rows_and_counts(case):
    declared, pinned = CASES[case]
    rng = np.random.default_rng(7)
    sizes = [500, 300, 200]
    lengths = [rng.integers(1, 60, size) for size in sizes]
    order = MixtureOrder(Mixture(WEIGHTS, **declared), sizes, block=16, seed=3,
                         lengths=None if "no lengths" in case else lengths)
    digest = hashlib.blake2b(digest_size=8)
    for epoch in range(3):
        digest.update(order.order(epoch).tobytes())
        digest.update(order.plan(epoch).counts.tobytes())
    assert digest.hexdigest() == pinned
