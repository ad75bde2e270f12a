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
