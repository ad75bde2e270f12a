import numpy as np
import pytest

from engine import plan_splits


class TestPlanSplits:
    def test_fraction_and_count_give_disjoint_complete_splits(self):
        for val_split, test_split in ((0.1, 0.2), (7, 11)):
            plan = plan_splits(100, val_split=val_split, test_split=test_split, seed=3)
            together = np.concatenate([plan.train, plan.val, plan.test])
            assert sorted(together.tolist()) == list(range(100))
            assert len(plan.val) == (10 if val_split == 0.1 else 7)
            assert len(plan.test) == (20 if test_split == 0.2 else 11)

    def test_same_seed_same_split_and_fingerprint(self):
        a, b = plan_splits(50, val_split=0.2, seed=1), plan_splits(50, val_split=0.2, seed=1)
        assert np.array_equal(a.val, b.val) and a.fingerprint == b.fingerprint

    def test_other_seed_other_split(self):
        a, b = plan_splits(50, val_split=0.2, seed=1), plan_splits(50, val_split=0.2, seed=2)
        assert not np.array_equal(a.val, b.val) and a.fingerprint != b.fingerprint

    def test_no_split_keeps_every_row_for_training(self):
        plan = plan_splits(5)
        assert plan.train.tolist() == [0, 1, 2, 3, 4] and len(plan.val) == 0

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"val_split": 1.0}, r"val_split=1.0 is out of range: a fraction must be in \[0, 1\)"),
            ({"val_split": -0.1}, r"val_split=-0.1 is out of range"),
            ({"val_split": 0.001}, r"val_split=0.001 of 10 rows leaves an empty split"),
            ({"val_split": 10}, r"val_split=10 rows is out of range for 10 rows"),
            ({"val_split": 0.5, "test_split": 0.5}, r"leaving no training rows"),
        ],
    )
    def test_bad_splits(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            plan_splits(10, **kwargs)

    def test_split_of_wrong_type(self):
        with pytest.raises(TypeError, match="val_split should be a fraction in"):
            plan_splits(10, val_split="10%")


class TestStratified:
    """stratify=True: val_split and test_split take every class in proportion, as datasets' train_test_split(
    stratify_by_column=...), and stay a seeded function of the seed."""

    LABELS = np.array([0] * 80 + [1] * 15 + [2] * 5)

    def test_each_split_takes_every_class_in_proportion(self):
        plan = plan_splits(100, val_split=0.2, test_split=0.1, seed=3, labels=self.LABELS)
        assert np.bincount(self.LABELS[plan.val]).tolist() == [16, 3, 1]
        assert np.bincount(self.LABELS[plan.test], minlength=3).tolist() == [8, 2, 0]  # 8, 1.5, 0.5: ties to class 1
        assert sorted(np.concatenate([plan.train, plan.val, plan.test]).tolist()) == list(range(100))
        plain = plan_splits(100, val_split=0.2, test_split=0.1, seed=3)
        assert np.bincount(self.LABELS[plain.val], minlength=3).tolist() != [16, 3, 1]  # not by chance here

    def test_the_plan_is_a_seeded_function_of_the_seed(self):
        one, again = (plan_splits(100, val_split=0.2, seed=5, labels=self.LABELS) for _ in range(2))
        other = plan_splits(100, val_split=0.2, seed=6, labels=self.LABELS)
        assert one.fingerprint == again.fingerprint != other.fingerprint
        assert np.bincount(self.LABELS[other.val]).tolist() == [16, 3, 1]

    def test_the_module_stratifies_its_val_split_by_the_specs_label(self):
        import datasets
        import torch

        from engine import UniversalDataModule
        from task_spec import TaskSpec

        spec = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 3})
        rows = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 100, "labels": self.LABELS.tolist()})
        dm = UniversalDataModule(rows, task_spec=spec, val_split=0.2, stratify=True, seed=3, batch_size=4)
        dm.setup()
        assert np.bincount(self.LABELS[dm.split_plan.val]).tolist() == [16, 3, 1]
        tensors = torch.utils.data.StackDataset(input_ids=[torch.tensor([5, 6, 7])] * 100,
                                                labels=torch.from_numpy(self.LABELS))
        by_rows = UniversalDataModule(tensors, task_spec=spec, val_split=0.2, stratify=True, seed=3, batch_size=4)
        by_rows.setup()  # a torch dataset: each row's label read once
        assert np.array_equal(by_rows.split_plan.val, dm.split_plan.val)

    @pytest.mark.parametrize(("spec", "options", "match"), [
        ("cls_tiny", {}, r"stratify=True stratifies the rows val_split and test_split cut from train_data, but got "
                         r"val_split=0.0 and test_split=0.0; pass val_split=\.\.\."),
        ("lm_tiny", {"val_split": 0.2}, r"stratify=True .* needs a classification task whose spec names its label "
                                        r"\(target_field\), but got task_type='causal_lm'"),
        ("cls_tiny", {"val_split": 0.2, "stratify": "labels"}, r"stratify should be a bool, but got "
                                                               r"stratify='labels'"),
    ])
    def test_stratify_where_it_cannot_apply_is_refused(self, spec, options, match):
        import torch

        from engine import UniversalDataModule
        from task_spec import TaskSpec

        rows = {"input_ids": [torch.tensor([5, 6, 7])] * 10, "labels": [0, 1] * 5}
        with pytest.raises((ValueError, TypeError), match=match):
            UniversalDataModule(rows, task_spec=getattr(TaskSpec, spec)(), **{"stratify": True, **options})
