"""A tiny causal LM on packed batches: its block-diagonal mask from position_ids keeps documents apart (a document's
logits are the same packed or alone), and it learns from batching='packed' batches (loss falls in a few dozen
CPU steps), which shows the packed fields are right."""

import pytest
import torch

from collators import PackedCollator
from demo.models import PackedCausalLM, document_causal_mask
from engine import UniversalDataModule
from task_spec import TaskSpec

VOCAB = 64
SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0, "eos_token_id": 1},
                                  additional_config={"vocab_size": VOCAB})


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: on a shared machine, two threads fighting over the tiny matmuls are several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def counting_documents(count, seed=0):
    """Documents that count up from a random start (mod VOCAB): learnable only from within the document."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (count,), generator=generator)
    lengths = torch.randint(4, 40, (count,), generator=generator)
    return [(int(start) + torch.arange(int(n))) % VOCAB for start, n in zip(starts, lengths)]


def test_the_mask_is_causal_within_each_document_only():
    mask = document_causal_mask(torch.tensor([[0, 1, 2, 0, 1]]))[0]
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
    assert torch.equal(mask, expected.bool())


@torch.no_grad()
def test_a_documents_logits_are_the_same_packed_or_alone():
    torch.manual_seed(0)
    model = PackedCausalLM(VOCAB, dim=32).eval()
    documents = counting_documents(4, seed=1)
    packed = PackedCollator()([{"input_ids": doc} for doc in documents])
    logits = model.logits(packed)[0]
    bounds = packed["cu_seq_lens_q"].tolist()
    for doc, start, end in zip(documents, bounds[:-1], bounds[1:]):
        alone = model.logits({"input_ids": doc[None], "position_ids": torch.arange(len(doc))[None]})[0]
        torch.testing.assert_close(logits[start:end], alone, atol=1e-5, rtol=1e-5)
    # Without the document boundaries (one long sequence), later documents see earlier ones and change.
    merged = {"input_ids": packed["input_ids"], "position_ids": torch.arange(bounds[-1])[None]}
    assert not torch.allclose(model.logits(merged)[0][bounds[1]:bounds[2]], logits[bounds[1]:bounds[2]], atol=1e-3)


def test_it_trains_on_packed_batches_with_loss_falling():
    torch.manual_seed(0)
    dm = UniversalDataModule(counting_documents(400), task_spec=SPEC, batching="packed", max_tokens=512, seed=3)
    model = PackedCausalLM(VOCAB, dim=32, max_positions=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, loader = [], dm.train_dataloader()
    while len(losses) < 40:
        for batch in loader:
            assert batch["input_ids"].shape[1] <= 512
            loss = model.loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if len(losses) == 40:
                break
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 3.0  # about ln(64) = 4.16 at the start
    assert last < 0.5 * first, (first, last)
