import random

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from engine import DataLoaderConfig, DataLoaderFactory, UniversalDataModule
from engine.tools.validation import (
    BatchValidationError,
    ValidationReport,
    first_batch,
    validate_batch,
    validate_first_batch,
)
from task_spec import TaskSpec

CLS4 = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 4, "vocab_size": 100})
LM = TaskSpec.lm_tiny()


def text_batch(labels=(0, 1), pad=0):
    ids = torch.tensor([[5, 6, 7], [8, 9, pad]])
    return {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "labels": torch.tensor(labels)}


def lm_rows(n=24):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 20, (n,), generator=generator)
    return [torch.randint(5, 500, (int(k),), generator=generator) for k in lengths]


class LabelledRows(Dataset):
    def __init__(self, top_label):
        self.top_label = top_label

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return {"input_ids": torch.tensor([5, 6, 7]), "labels": self.top_label if index == 3 else 0}


class TestValidateBatch:
    def test_good_batch_passes_every_check(self):
        report = validate_batch(text_batch(), CLS4)
        assert isinstance(report, ValidationReport) and report.passed
        assert [check.name for check in report.checks] == [
            "keys", "dtypes", "shapes", "finite", "label_range", "attention_mask"]
        assert all(check.status == "ok" for check in report.checks)
        assert "passed" in str(report) and "input_ids" in str(report)

    def test_labels_past_num_classes_name_the_bound_the_max_and_the_fix(self):
        message = ('labels max 7 >= num_classes 4: the spec says 4 classes; check '
                   'TaskSpec.additional_config["num_classes"] or the label mapping')
        with pytest.raises(BatchValidationError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
            validate_batch(text_batch(labels=(1, 7)), CLS4)
        assert isinstance(info.value, ValueError)
        assert info.value.report["label_range"].status == "failed"
        assert info.value.report["label_range"].problems[0][0] == "labels"

    def test_negative_labels_fail_but_ignore_index_is_skipped(self):
        with pytest.raises(BatchValidationError, match=r"labels min -3 < 0, outside \[0, num_classes 4\)"):
            validate_batch(text_batch(labels=(1, -3)), CLS4)
        assert validate_batch(text_batch(labels=(1, -100)), CLS4).passed

    def test_missing_target_is_a_keys_mismatch_expected_vs_got(self):
        batch = text_batch()
        del batch["labels"]
        with pytest.raises(BatchValidationError, match=r"keys mismatch: expected \['input_ids', 'labels'\], but got "
                                                       r"\['attention_mask', 'input_ids'\].*TaskSpec.target_field"):
            validate_batch(batch, CLS4)

    def test_list_batch_under_a_spec_is_a_keys_mismatch(self):
        with pytest.raises(BatchValidationError, match=r"keys mismatch: expected \['input_ids', 'labels'\], but got "
                                                       r"\['batch\[0\]', 'batch\[1\]'\]"):
            validate_batch([torch.ones(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)], CLS4)

    def test_float_ids_and_float_class_labels_are_dtype_errors(self):
        batch = text_batch()
        batch["input_ids"] = batch["input_ids"].float()
        batch["labels"] = batch["labels"].float()
        report = validate_batch(batch, CLS4, raise_on_error=False)
        problems = dict(report["dtypes"].problems)
        assert "input_ids has dtype torch.float32, expected an integer dtype" in problems["input_ids"]
        assert "needs integer class ids" in problems["labels"]
        assert not report.passed

    def test_regression_needs_float_targets(self):
        spec = TaskSpec(name="r", task_type="regression", loss_type="mse")
        with pytest.raises(BatchValidationError, match="task_type='regression' needs float targets"):
            validate_batch(text_batch(), spec)

    def test_images_must_be_float_or_uint8_and_match_image_size(self):
        spec = TaskSpec.vision_tiny()
        good = {"pixel_values": torch.zeros(2, 3, 32, 32), "labels": torch.tensor([0, 3])}
        assert validate_batch(good, spec).passed
        assert validate_batch({**good, "pixel_values": torch.zeros(2, 3, 32, 32, dtype=torch.uint8)}, spec).passed
        with pytest.raises(BatchValidationError, match="pixel_values has dtype torch.int64, expected float"):
            validate_batch({**good, "pixel_values": torch.zeros(2, 3, 32, 32, dtype=torch.long)}, spec)
        with pytest.raises(BatchValidationError, match=r"pixel_values has shape \[2, 3, 28, 28\], but TaskSpec."
                                                       r"additional_config\['image_size'\] is \[3, 32, 32\]"):
            validate_batch({**good, "pixel_values": torch.zeros(2, 3, 28, 28)}, spec)

    def test_batch_dims_must_agree(self):
        batch = {**text_batch(), "labels": torch.tensor([0, 1, 1])}
        with pytest.raises(BatchValidationError, match="batch dims disagree: input_ids has 2 rows but labels has 3"):
            validate_batch(batch, CLS4)

    def test_nan_and_inf_are_detected_by_key(self):
        values = torch.zeros(2, 3, 32, 32)
        values[0, 0, 0, 0] = float("nan")
        values[1, 0, 0, 0] = float("inf")
        report = validate_batch({"pixel_values": values, "labels": torch.tensor([0, 1])}, TaskSpec.vision_tiny(),
                                raise_on_error=False)
        texts = [text for _, text in report["finite"].problems]
        assert texts[0].startswith("NaN detected in pixel_values (1 of 6144 values)")
        assert texts[1].startswith("Inf detected in pixel_values")

    def test_token_ids_and_lm_labels_are_checked_against_vocab_size_ignoring_minus_100(self):
        spec = LM.replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 50})
        ids = torch.tensor([[5, 6, 7], [8, 9, 50256]])
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
        with pytest.raises(BatchValidationError, match="input_ids max 50256 >= vocab_size 50: token ids must be"):
            validate_batch({"input_ids": ids, "attention_mask": mask, "labels": ids}, spec)
        ids[1, 2] = 0
        labels = ids.masked_fill(mask == 0, -100)
        assert validate_batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, spec, pad_token_id=0).passed
        labels[0, 0] = 60
        with pytest.raises(BatchValidationError, match="labels max 60 >= vocab_size 50"):
            validate_batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, spec, pad_token_id=0)

    def test_sequences_longer_than_max_seq_len_fail(self):
        spec = LM.replace(additional_config={"max_seq_len": 2})
        with pytest.raises(BatchValidationError, match="input_ids length 3 > max_seq_len 2"):
            validate_batch(text_batch(), spec)


class TestAttentionMask:
    def test_values_other_than_0_and_1(self):
        batch = {**text_batch(), "attention_mask": torch.tensor([[1, 2, 1], [1, 1, 0]])}
        with pytest.raises(BatchValidationError, match=r"attention_mask holds values other than 0 and 1 \(found "
                                                       r"\[0, 1, 2\]\)"):
            validate_batch(batch, CLS4)

    def test_shape_must_match_input_ids(self):
        batch = {**text_batch(), "attention_mask": torch.ones(2, 4, dtype=torch.long)}
        with pytest.raises(BatchValidationError, match=r"attention_mask has shape \[2, 4\] but input_ids has shape "
                                                       r"\[2, 3\]"):
            validate_batch(batch, CLS4)

    def test_all_zero_row_of_real_tokens_fails_but_an_empty_row_passes(self):
        batch = {**text_batch(), "attention_mask": torch.tensor([[0, 0, 0], [1, 1, 0]])}
        with pytest.raises(BatchValidationError, match=r"attention_mask rows \[0\] are all zeros but the rows are not "
                                                       r"empty"):
            validate_batch(batch, CLS4, pad_token_id=0)
        empty = {**batch, "input_ids": torch.tensor([[0, 0, 0], [8, 9, 0]])}
        assert validate_batch(empty, CLS4, pad_token_id=0).passed

    def test_padded_positions_must_hold_the_pad_id(self):
        with pytest.raises(BatchValidationError, match="input_ids holds 1 id.s. other than the pad id 0 where "
                                                       "attention_mask is 0"):
            validate_batch(text_batch(pad=3), CLS4)
        assert validate_batch(text_batch(pad=3), CLS4, pad_token_id=3).passed

    def test_pad_id_comes_from_the_spec_when_not_given(self):
        with pytest.raises(BatchValidationError, match="other than the pad id 50256"):
            validate_batch(text_batch(), LM)  # lm_tiny pads with 50256, the batch with 0


class TestWithoutSpec:
    def test_spec_checks_are_skipped_and_tensor_checks_still_run(self):
        report = validate_batch([torch.ones(2, 3), torch.zeros(2)])
        assert report.passed
        assert report["keys"].status == "skipped" and report["label_range"].status == "skipped"
        with pytest.raises(BatchValidationError, match=r"NaN detected in batch\[0\]"):
            validate_batch([torch.tensor([[float("nan")]]), torch.zeros(1)])

    def test_rejects_a_spec_of_the_wrong_type(self):
        with pytest.raises(TypeError, match="task_spec should be a TaskSpec, but got dict"):
            validate_batch(text_batch(), {"num_classes": 4})


class TestValidateFirstBatch:
    def test_module_first_batch_is_the_real_first_batch_and_passes(self):
        dm = UniversalDataModule(lm_rows(), task_spec=LM, batch_size=4, seed=3)
        report = validate_first_batch(dm)
        assert report.passed and report.spec_name == "lm_tiny"
        loader = dm.train_dataloader()
        built = first_batch(loader)
        real = next(iter(loader))
        assert built.keys() == real.keys()
        assert all(torch.equal(built[key], real[key]) for key in real)

    def test_validating_does_not_shift_the_training_order(self):
        def epochs(dm, n=2):
            return [[batch["input_ids"].tolist() for batch in dm.train_dataloader()] for _ in range(n)]

        reference = UniversalDataModule(lm_rows(), task_spec=LM, batch_size=4, seed=3)
        validated = UniversalDataModule(lm_rows(), task_spec=LM, batch_size=4, seed=3)
        before = validated.train_dataloader().state_dict()
        validate_first_batch(validated)
        validate_first_batch(validated)
        assert validated.train_dataloader().state_dict() == before
        assert epochs(validated) == epochs(reference)

    def test_validating_mid_epoch_does_not_disturb_this_epoch_or_the_next(self):
        reference_loader = UniversalDataModule(lm_rows(), task_spec=LM, batch_size=4, seed=3).train_dataloader()
        reference = [[b["input_ids"].tolist() for b in reference_loader] for _ in range(2)]
        loader = UniversalDataModule(lm_rows(), task_spec=LM, batch_size=4, seed=3).train_dataloader()
        iterator = iter(loader)
        seen = [next(iterator)["input_ids"].tolist() for _ in range(2)]
        validate_first_batch(loader, LM)
        seen += [b["input_ids"].tolist() for b in iterator]
        assert [seen, [b["input_ids"].tolist() for b in loader]] == reference

    def test_plain_shuffled_loader_leaves_global_random_state_alone(self):
        data = [{"input_ids": torch.tensor([i + 1, i + 2]), "labels": torch.tensor(i % 2)} for i in range(20)]
        torch.manual_seed(0)
        random.seed(0)
        validate_first_batch(DataLoader(data, batch_size=4, shuffle=True), CLS4)
        after = (torch.rand(1).item(), random.random())
        torch.manual_seed(0)
        random.seed(0)
        assert after == (torch.rand(1).item(), random.random())

    def test_label_problem_in_a_loader_raises_with_the_spec_bound(self):
        loader = DataLoaderFactory().create_dataloader(LabelledRows(top_label=7), DataLoaderConfig(batch_size=8))
        with pytest.raises(BatchValidationError, match="labels max 7 >= num_classes 4"):
            validate_first_batch(loader, CLS4)
        assert validate_first_batch(loader, CLS4, raise_on_error=False).passed is False

    def test_workers_are_not_started(self):
        loader = DataLoaderFactory().create_dataloader(
            LabelledRows(top_label=1), DataLoaderConfig(batch_size=4, num_workers=2))
        assert validate_first_batch(loader, CLS4).passed
        assert loader._iterator is None

    def test_pad_id_is_read_from_the_collator(self):
        class PadsWithOne:
            pad_token_id = 0

            def __call__(self, rows):
                return {"input_ids": torch.tensor([[5, 1]]), "attention_mask": torch.tensor([[1, 0]]),
                        "labels": torch.tensor([0])}

        loader = DataLoader(list(range(4)), batch_size=1, collate_fn=PadsWithOne())
        with pytest.raises(BatchValidationError, match="other than the pad id 0"):
            validate_first_batch(loader, CLS4.replace(special_tokens={"pad_token_id": 1}))

    def test_empty_loader_and_wrong_argument(self):
        with pytest.raises(ValueError, match="yields no batches"):
            validate_first_batch(DataLoader([], batch_size=2))
        with pytest.raises(TypeError, match="takes a DataLoader or a data module"):
            validate_first_batch([1, 2, 3])


def test_position_and_token_type_ids_are_not_checked_against_the_vocabulary():
    spec = LM.replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 10})
    batch = {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]]),
             "labels": torch.tensor([[5, 6]]), "position_ids": torch.tensor([[0, 20]]),
             "token_type_ids": torch.tensor([[0, 12]])}
    assert validate_batch(batch, spec, pad_token_id=0).passed
    batch["decoder_input_ids"] = torch.tensor([[11, 0]])
    with pytest.raises(BatchValidationError, match="decoder_input_ids max 11 >= vocab_size 10"):
        validate_batch(batch, spec, pad_token_id=0)
