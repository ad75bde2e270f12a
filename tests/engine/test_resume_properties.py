"""Property: stop anywhere (mid-epoch, on a boundary, after a loop that ran to its end), save, resume in a new
module, and the batches seen before and after are exactly the uninterrupted run's, for every batching mode."""

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.test_resume import fingerprint, module

MODES = {"plain": {}, "grouped": {}, "token_budget": {"max_tokens": 120}}
EPOCHS = 3


def uninterrupted(workers, batching):
    loader = module(workers, batching=batching, **MODES[batching]).train_dataloader()
    return [[fingerprint(batch) for batch in loader] for _ in range(EPOCHS)]


def run_until(dm, epoch, index, finish_loop):
    """Iterate as a training loop does, stopping after batch ``index`` of ``epoch`` (``index == len``: after the
    whole epoch; with ``finish_loop`` the ``for`` loop then runs to its end, otherwise it breaks)."""
    seen, loader = [], dm.train_dataloader()
    for current in range(epoch + 1):
        for position, batch in enumerate(loader):
            seen.append(fingerprint(batch))
            if current == epoch and position + 1 == index and not finish_loop:
                break
        else:
            continue
        break
    return seen


def resumed_rest(state, workers, batching, count):
    dm = module(workers, batching=batching, **MODES[batching])
    dm.load_state_dict(pickle.loads(pickle.dumps(state)))
    seen, loader = [], dm.train_dataloader()
    while len(seen) < count:
        seen += [fingerprint(batch) for batch in loader][: count - len(seen)]
    return seen


def check(workers, batching, data):
    reference = uninterrupted(workers, batching)
    epoch = data.draw(st.integers(0, EPOCHS - 2), label="epoch")
    index = data.draw(st.integers(1, len(reference[epoch])), label="batches into it")
    finish_loop = index == len(reference[epoch]) and data.draw(st.booleans(), label="loop ran to its end")
    first = module(workers, batching=batching, **MODES[batching])
    before = run_until(first, epoch, index, finish_loop)
    flat = [batch for epoch_batches in reference for batch in epoch_batches]
    assert before == flat[: len(before)]
    after = resumed_rest(first.state_dict(), workers, batching, len(flat) - len(before))
    assert before + after == flat  # nothing lost, nothing repeated, the same masks


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batching=st.sampled_from(sorted(MODES)), data=st.data())
def test_resume_without_workers_is_exact_at_any_stop(batching, data):
    check(0, batching, data)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(batching=st.sampled_from(sorted(MODES)), data=st.data())
def test_resume_with_two_workers_is_exact_at_any_stop(batching, data):
    check(2, batching, data)
