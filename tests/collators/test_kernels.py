"""The compiled padding loops behind ``PaddingLayout.gather``, ``gather_tokens``, ``repad`` and ``write_mask``
equal a plain Python reference on random layouts: every integer and bool dtype, read-only, strided and zero-stride
buffers, both padding sides, truncated rows, empty rows and empty batches; other dtypes keep the numpy path, with
the same result."""

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collators._padding import PaddingLayout

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def reference(values, starts, lengths, width, side, pad_value):
    """Row by row in Python: each row's first ``width`` values, padded on ``side``."""
    rows = []
    for start, length in zip(starts.tolist(), lengths.tolist()):
        kept = [int(v) for v in values[start:start + min(length, width)].astype(np.int64)]
        padding = [pad_value] * (width - len(kept))
        rows.append(kept + padding if side == "right" else padding + kept)
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), width)


@st.composite
def layouts(draw):
    dtype = draw(st.sampled_from(DTYPES))
    size = draw(st.integers(0, 60))
    high = 2 if dtype is np.bool_ else min(int(np.iinfo(dtype).max), 10_000)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    values = rng.integers(0, high, size).astype(dtype)
    form = draw(st.sampled_from(["plain", "read-only", "strided", "zero-stride"]))
    if form == "read-only":
        values.flags.writeable = False
    elif form == "strided":
        values = np.repeat(values, 2)[::2]
    elif form == "zero-stride":
        values = np.broadcast_to(values[:1] if size else np.ones(1, dtype=dtype), (max(size, 1),))
    rows = draw(st.integers(0, 6))
    lengths = np.asarray([draw(st.integers(0, len(values))) for _ in range(rows)], dtype=np.int64)
    starts = np.asarray([0 if form == "zero-stride" else draw(st.integers(0, len(values) - n)) for n in lengths],
                        dtype=np.int64)
    width = draw(st.integers(0, 12))
    side = draw(st.sampled_from(["right", "left"]))
    pad_value = draw(st.sampled_from([0, -100, 50256]))
    return values, starts, lengths, width, side, pad_value


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_gather_repad_and_mask_equal_the_reference(case):
    check_gather_repad_and_mask(case)


def check_gather_repad_and_mask(case):
    values, starts, lengths, width, side, pad_value = case
    layout = PaddingLayout(lengths, length=width, padding_side=side)
    expected = reference(values, starts, lengths, width, side, pad_value)
    before = values.copy()
    out = torch.full((len(lengths), width), 123, dtype=torch.int64)
    assert layout.gather(values, starts, pad_value, out=out) is out
    assert torch.equal(out, expected)
    assert np.array_equal(values, before)  # only read
    relabelled = np.full_like(out.numpy(), 7)
    layout.repad(out.numpy(), -100, out=relabelled)
    assert torch.equal(torch.from_numpy(relabelled), expected.masked_fill(~layout.mask, -100))
    mask = torch.full_like(out, 9)
    assert torch.equal(layout.write_mask(mask), layout.mask.long())
    assert layout.mask.shape == (len(lengths), width)
    assert layout.mask.sum(1).tolist() == np.minimum(lengths, width).tolist()


@settings(max_examples=300, deadline=None)
@given(layouts(), st.sampled_from(["mask", "labels", "both", "neither"]))
def test_gather_tokens_writes_ids_mask_and_labels_in_one_pass_and_returns_the_kept_range(case, extras):
    check_gather_tokens(case, extras)


def check_gather_tokens(case, extras):
    values, starts, lengths, width, side, pad_value = case
    layout = PaddingLayout(lengths, length=width, padding_side=side)
    expected = reference(values, starts, lengths, width, side, pad_value)
    out, mask, labels = (np.full((len(lengths), width), fill, dtype=np.int64) for fill in (123, 9, 7))
    low, high = layout.gather_tokens(values, starts, pad_value, out, mask=mask if extras in ("mask", "both") else None,
                                     labels=labels if extras in ("labels", "both") else None, label_pad=-100)
    assert torch.equal(torch.from_numpy(out), expected)
    assert np.array_equal(mask, layout.mask.long().numpy() if extras in ("mask", "both") else np.full_like(mask, 9))
    assert np.array_equal(labels, expected.masked_fill(~layout.mask, -100).numpy() if extras in ("labels", "both")
                          else np.full_like(labels, 7))
    kept = expected[layout.mask]
    assert (low, high) == ((int(kept.min()), int(kept.max())) if len(kept) else (2**63 - 1, -2**63))


def test_gather_tokens_refuses_outputs_it_cannot_write_and_pad_values_beyond_int64():
    layout = PaddingLayout(np.array([2, 3]), length=3)
    values, starts = np.arange(10), np.array([0, 4])
    read_only = np.zeros((2, 3), np.int64)
    read_only.flags.writeable = False
    for bad in (np.zeros((2, 4), np.int64), np.zeros((3, 3), np.int64), np.zeros((2, 3), np.int32), read_only):
        with pytest.raises(TypeError, match=r"writable int64 outputs of shape \(2, 3\)"):
            layout.gather_tokens(values, starts, 0, np.zeros((2, 3), np.int64), mask=bad)
    with pytest.raises(TypeError, match="integer or bool values"):
        layout.gather_tokens(values.astype(np.float32), starts, 0, np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match=r"pad values should be int64 integers, but got pad_value=0, "
                                         r"label_pad=9223372036854775808"):
        layout.gather_tokens(values, starts, 0, np.zeros((2, 3), np.int64), label_pad=2**63)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("out_dtype, values_dtype", [(torch.float32, np.int64), (torch.int32, np.int32),
                                                     (torch.int64, np.float32), (torch.bool, np.bool_)])
def test_other_dtypes_take_the_numpy_path_with_the_same_result(side, out_dtype, values_dtype):
    values = np.arange(1, 21).astype(values_dtype) if values_dtype is not np.bool_ else np.arange(20) % 3 == 0
    starts, lengths = np.array([3, 0, 12]), np.array([5, 2, 8])
    layout = PaddingLayout(lengths, length=6, padding_side=side)
    out = torch.empty((3, 6), dtype=out_dtype)
    layout.gather(values, starts, 0, out=out)
    expected = reference(values, starts, lengths, 6, side, 0).to(out_dtype)
    assert torch.equal(out, expected)


def test_a_float_pad_value_takes_the_numpy_path():
    layout = PaddingLayout(np.array([1, 3]), length=3)
    out = torch.empty((2, 3), dtype=torch.int64)
    layout.gather(np.arange(10), np.array([4, 0]), 2.0, out=out)  # numpy's cast, as before: 2.0 -> 2
    assert out.tolist() == [[4, 2, 2], [0, 1, 2]]


@pytest.mark.parametrize("start", [-1, 8])
def test_a_span_outside_the_values_is_refused_before_anything_is_written(start):
    layout = PaddingLayout(np.array([2, 3]), length=3)
    out = torch.full((2, 3), 5, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"row 1: its kept span starts={start}, length 3 should lie inside values "
                                         r"\(length 10\)"):
        layout.gather(np.arange(10), np.array([0, start]), 0, out=out)
    assert torch.equal(out, torch.full((2, 3), 5))


def test_without_a_writable_cache_location_the_loops_compile_per_process_and_say_so(monkeypatch):
    from numba.core import config

    from collators.compiled import compiled

    monkeypatch.setattr(config, "CACHE_LOCATOR_CLASSES", "IPythonCacheLocator")  # finds no place outside IPython

    def double(values):
        return values * 2

    with pytest.warns(UserWarning, match=r"no locator available .* set NUMBA_CACHE_DIR to a writable folder"):
        loop = compiled(double)
    assert loop(np.int64(21)) == 42


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20), st.lists(st.tuples(st.integers(-3, 25), st.integers(-3, 25)), max_size=6))
def test_first_span_outside_names_the_first_span_that_leaves_its_values(size, spans):
    from collators._kernels import first_span_outside

    starts = np.array([start for start, _ in spans], dtype=np.int64)
    lengths = np.array([length for _, length in spans], dtype=np.int64)
    outside = [row for row, (start, length) in enumerate(spans) if length < 0 or start < 0 or start + length > size]
    assert first_span_outside(size, starts, lengths) == (outside[0] if outside else -1)


def test_starts_of_another_length_than_the_rows_are_refused_before_the_loop_reads_them():
    layout = PaddingLayout(np.array([2, 3, 1]), length=3)
    with pytest.raises(ValueError, match=r"starts should hold one start per row \(3\), but got 2"):
        layout.gather(np.arange(10), np.array([0, 4]), 0, out=torch.empty((3, 3), dtype=torch.int64))


def test_warmed_loops_serve_arrow_token_rows_without_compiling():
    from collators._kernels import pad_spans
    from collators.text import warm_token_loops

    warm_token_loops()
    compiled = len(pad_spans.dispatcher.overloads)
    for dtype in (np.int32, np.int64):
        values = np.arange(10, dtype=dtype)
        values.flags.writeable = False  # as memory-mapped Arrow buffers are
        layout = PaddingLayout(np.array([3, 5]), length=6)
        layout.gather(values, np.array([0, 4]), pad_value=0)
    assert len(pad_spans.dispatcher.overloads) == compiled  # a forked worker inherits these: it compiles nothing


@contextlib.contextmanager
def as_a_loader_worker():
    """The loops as a loader worker runs them when the process that forked it had not loaded them: their numpy
    twins. A worker never loads the compiled ones; they are back afterwards."""
    from collators import _kernels, compiled

    saved, worker_info = [loop.dispatcher for loop in _kernels.LOOPS], compiled.get_worker_info
    try:
        for loop in _kernels.LOOPS:
            loop.dispatcher = None
        compiled.get_worker_info = lambda: object()
        yield
        assert not any(loop.dispatcher for loop in _kernels.LOOPS)
    finally:
        compiled.get_worker_info = worker_info
        for loop, dispatcher in zip(_kernels.LOOPS, saved):
            loop.dispatcher = dispatcher


@settings(max_examples=300, deadline=None)
@given(layouts(), st.sampled_from(["mask", "labels", "both", "neither"]))
def test_a_loader_workers_numpy_twins_give_the_reference_values(case, extras):
    with as_a_loader_worker():
        check_gather_repad_and_mask(case)
        check_gather_tokens(case, extras)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.booleans(), st.sampled_from([np.int32, np.int64]),
       st.integers(-2, 9))
def test_the_numpy_twins_give_the_compiled_values_refusals_and_ranges(lengths, left, dtype, pad):
    """A loader worker runs the loops' numpy twins (:class:`collators._kernels.KernelLoop`): the padded rows, mask,
    labels, value range and refusals (with the range found before them) are those of the compiled loops."""
    from collators import _kernels

    _kernels.load()
    values = np.arange(100, 100 + sum(lengths) + 3, dtype=dtype)
    kept = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(kept)[:-1]]).astype(np.int64)
    if pad == 9:  # a span past the values: refused, nothing written
        starts[-1] = len(values)
        kept[-1] = max(kept[-1], 1)
    width = int(kept.max()) + 1
    results = []
    for run in (_kernels.pad_spans.dispatcher, _kernels.pad_spans.twin):
        out, mask, labels = (np.full((len(kept), width), 7, dtype=np.int64) for _ in range(3))
        found = run(values, starts, kept, left, pad, out, mask, labels, -100)
        results.append(([int(value) for value in found], out.tolist(), mask.tolist(), labels.tolist()))
    assert results[0] == results[1]
    outside = [run(values.size, starts, kept) for run in (_kernels.first_span_outside.dispatcher,
                                                           _kernels.first_span_outside.twin)]
    assert outside[0] == outside[1]
    for loop in (_kernels.write_mask, _kernels.repad_rows):
        written = []
        for run in (loop.dispatcher, loop.twin):
            out = np.full((len(kept), width), 7, dtype=np.int64)
            arguments = (np.minimum(kept, width), left, out) if loop is _kernels.write_mask else (
                np.arange(out.size).reshape(out.shape), np.minimum(kept, width), left, pad, out)
            run(*arguments)
            written.append(out.tolist())
        assert written[0] == written[1]


def test_the_scale_normalize_twin_equals_the_compiled_loop_bit_for_bit():
    from collators import _kernels

    _kernels.load()
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 500), dtype=np.uint8)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    outs = [np.full(images.shape, np.nan, np.float32) for _ in range(2)]
    for run, out in zip((_kernels.scale_normalize.dispatcher, _kernels.scale_normalize.twin), outs):
        run(images, np.float32(1 / 255), mean, std, out)
    assert outs[0].tobytes() == outs[1].tobytes()
