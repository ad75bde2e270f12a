"""batching='packed' through UniversalDataModule: the packed collator is chosen, batches are the same at 0 and 2
workers, resume is exact mid-epoch and after a finished epoch, masked LM and the value checks work on packed
batches, and an Arrow-backed dataset gives what DataCollatorWithFlattening gives on the same rows."""

import logging
import pickle
import warnings

import datasets
import lightning
import pytest
import torch
from transformers import DataCollatorWithFlattening

from collators import PackedCollator
from engine import UniversalDataModule
from task_spec import TaskSpec
from tests.engine.test_resume import fingerprint, run

VOCAB = 600
LM = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0, "eos_token_id": 1},
                                additional_config={"vocab_size": VOCAB})
MLM = TaskSpec.mlm_tiny().replace(special_tokens={"pad_token_id": 0, "mask_token_id": 1},
                                  additional_config={"vocab_size": VOCAB})


def rows(count=60, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (count,), generator=generator)
    return [torch.randint(2, VOCAB, (int(n),), generator=generator) for n in lengths]


def module(workers=0, spec=LM, data=None, **kwargs):
    options = dict(task_spec=spec, batching="packed", max_tokens=128, val_split=5, seed=11, num_workers=workers)
    options.update(kwargs)
    return UniversalDataModule(data if data is not None else rows(), **options)


def epochs(dm, count):
    loader = dm.train_dataloader()
    return [[fingerprint(batch) for batch in loader] for _ in range(count)]


class TestChoice:
    def test_the_packed_collator_is_chosen_and_says_why(self):
        dm = module()
        assert isinstance(dm.collator, PackedCollator)
        assert "batching='packed' (batching= was given)" in dm.collator_resolution.reason
        batch = next(iter(dm.train_dataloader()))
        assert batch["input_ids"].shape[0] == 1 and batch["input_ids"].shape[1] <= 128
        assert batch["cu_seq_lens_q"][-1] == batch["input_ids"].shape[1]

    def test_the_summary_shows_a_packed_batch_within_the_budget(self):
        dm = module(max_tokens=64)
        dm.setup()
        width = int(repr(dm).split("input_ids: [1, ")[1].split("]")[0])
        assert 0 < width <= 64
        assert "loader: max_tokens=64 (packed), shuffle=True" in repr(dm)  # the budget, not a row count

    def test_a_spec_that_cannot_be_packed_is_refused_at_construction(self):
        with pytest.raises(ValueError, match="task_type='seq2seq'; use batching='plain', 'grouped' or"):
            pairs = datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4, "labels": [[7, 8]] * 4})
            module(spec=TaskSpec.seq2seq_tiny(), data=pairs, val_split=0)

    def test_a_document_over_the_budget_is_refused_at_setup_naming_it(self):
        data = rows()
        data[7] = torch.arange(2, 202)  # 200 tokens, counted as the 128 that max_seq_len keeps
        with pytest.raises(ValueError, match=r"1 row\(s\) are longer than max_tokens=100: row 7 has 128 tokens"):
            module(data=data, val_split=0, max_tokens=100).train_dataloader()

    def test_documents_are_cut_to_max_seq_len_as_the_text_collator_cuts_rows(self):
        data = rows()
        data[7] = torch.arange(2, 202)
        dm = module(data=data, val_split=0, validate=True)  # validate: the first batch matches the spec
        dm.setup()
        assert dm.validation_report.passed
        assert dm.collator.max_length == 128 and dm.truncation["long_rows"] == 1
        batches = list(dm.train_dataloader())
        longest = max(int(b["cu_seq_lens_q"].diff().max()) for b in batches)
        assert longest == 128 and max(b["max_length_q"] for b in batches) == 128
        assert sum(b["input_ids"].shape[1] for b in batches) == sum(min(len(r), 128) for r in data)

    def test_an_id_past_the_vocabulary_is_refused_naming_the_dataset_row(self):
        data = rows()
        data[4] = torch.tensor([5, 6, VOCAB])
        dm = module(data=data, val_split=0)
        with pytest.raises(ValueError, match=r"rows \[.*\b4\b.*\] of the train data failed.*'input_ids' should hold "
                                             r"values in \[0, 600\)"):
            list(dm.train_dataloader())


class TestReproducible:
    def test_the_same_batches_at_0_and_2_workers_and_every_document_once(self):
        reference = epochs(module(0), 2)
        assert epochs(module(2), 2) == reference
        assert reference[0] != reference[1]
        dm = module(0)
        served = sorted(int(i) for b in dm.train_dataloader().batch_sampler for i in b)
        assert served == list(range(len(dm.datasets["train"])))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_resume_mid_epoch_continues_exactly(self, workers):
        reference = run(module(workers), 12)
        first = module(workers)
        assert run(first, 3) == reference[:3]
        resumed = module(workers)
        resumed.load_state_dict(pickle.loads(pickle.dumps(first.data_state())))
        assert run(resumed, 9) == reference[3:]

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_state_saved_after_a_finished_epoch_resumes_at_the_next_epoch(self, workers):
        reference = epochs(module(workers), 3)
        first = module(workers)
        assert epochs(first, 1) == reference[:1]
        state = pickle.loads(pickle.dumps(first.data_state()))
        assert state["epoch"] == 1
        resumed = module(workers)
        resumed.load_state_dict(state)
        assert epochs(resumed, 2) == reference[1:]

    def test_a_state_from_another_budget_is_refused(self):
        state = module().data_state()
        with pytest.raises(ValueError, match="max_tokens"):
            module(max_tokens=256).load_state_dict(state)


class TestMaskedLM:
    def test_masks_are_seeded_per_batch_and_specials_never_selected(self):
        first = next(iter(module(spec=MLM).train_dataloader()))
        again = next(iter(module(spec=MLM, num_workers=2).train_dataloader()))
        assert fingerprint(first) == fingerprint(again)
        selected = first["labels"] != -100
        assert selected.any() and not selected.all()
        assert torch.isin(first["input_ids"][selected], torch.arange(VOCAB)).all()
        assert first["position_ids"].shape == first["input_ids"].shape


def test_an_arrow_dataset_packs_as_data_collator_with_flattening_does():
    data = datasets.Dataset.from_dict({"input_ids": [row.tolist() for row in rows()]})
    dm = module(data=data, val_split=0)
    loader = dm.train_dataloader()
    reference = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    batches = list(loader)
    assert len(batches) == len(loader.batch_sampler.epoch_batches(0))
    for indices, batch in zip(loader.batch_sampler.epoch_batches(0), batches):
        expected = reference([{"input_ids": data[int(i)]["input_ids"]} for i in indices])
        assert set(batch) == set(expected)
        for key, value in expected.items():
            assert (torch.equal(batch[key], value) and batch[key].dtype == value.dtype) if torch.is_tensor(value) \
                else batch[key] == value


class Recorder(lightning.LightningModule):
    """Records the fingerprint of every training batch; trains a tiny model so Lightning runs real steps."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)
        self.seen: list[str] = []

    def training_step(self, batch, batch_index):
        self.seen.append(fingerprint({key: value.cpu() if torch.is_tensor(value) else value
                                      for key, value in batch.items()}))
        logits = self.head(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(**kwargs):
    return lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=False,
                             **kwargs)


def test_a_new_lightning_trainer_extending_a_stopped_run_sees_the_next_packed_batches(tmp_path):
    logging.getLogger("lightning").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_epoch = len(module().train_dataloader())
        full = Recorder()
        trainer(max_steps=per_epoch + 3).fit(full, datamodule=module())  # crosses into the second epoch
        stopped = trainer(max_steps=2)
        stopped.fit(Recorder(), datamodule=module())
        stopped.save_checkpoint(tmp_path / "two.ckpt")
        extended = Recorder()
        trainer(max_steps=per_epoch + 3).fit(extended, datamodule=module(), ckpt_path=tmp_path / "two.ckpt")
    assert extended.seen == full.seen[2:]
