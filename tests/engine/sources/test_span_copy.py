"""A mixed batch's span copies: a loader worker's numpy twins give the compiled loops' values and refusals."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sources import _span_copy


@st.composite
def spans(draw):
    """Sources laid end to end (each a buffer and rows as spans inside it), and batch rows to gather (-1 and the
    row past the end are out of range)."""
    buffers, starts, lengths, counts = [], [], [], []
    for source in range(draw(st.integers(1, 4))):
        buffer = np.arange(draw(st.integers(0, 40)), dtype=np.int32) + 1000 * source
        spans = draw(st.lists(st.tuples(st.integers(0, len(buffer)), st.integers(0, len(buffer))), max_size=5))
        buffers.append(buffer)
        counts.append(len(spans))
        starts += [start for start, _ in spans]
        lengths += [min(length, len(buffer) - start) for start, length in spans]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    rows = draw(st.lists(st.integers(-1, total), max_size=8))
    return (np.asarray(rows, dtype=np.int64), offsets, tuple(buffers), np.asarray(starts, dtype=np.int64),
            np.asarray(lengths, dtype=np.int64), np.arange(total, dtype=np.int64) * 10)


@settings(max_examples=300, deadline=None)
@given(spans())
def test_the_gather_twin_gives_the_compiled_rows_and_refusals(case):
    compiled = _span_copy.gather_spans.load()(*case)
    twin = _span_copy.gather_spans.twin(*case)
    assert compiled[0] == twin[0]
    if compiled[0] < 0:
        for expected, got in zip(compiled[1:], twin[1:]):
            assert expected.dtype == got.dtype and expected.tolist() == got.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=6))
def test_the_copy_twin_gives_the_compiled_buffer(pairs):
    values = np.arange(40, dtype=np.int64)
    starts = np.asarray([start for start, _ in pairs], dtype=np.int64)
    lengths = np.asarray([length for _, length in pairs], dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(pairs) else starts
    outs = [np.full(int(lengths.sum()), -1, dtype=np.int64) for _ in range(2)]
    _span_copy.copy_spans.load()(values, starts, lengths, outs[0], at)
    _span_copy.copy_spans.twin(values, starts, lengths, outs[1], at)
    assert outs[0].tolist() == outs[1].tolist()
