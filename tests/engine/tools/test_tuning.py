import pytest
import torch

from engine import UniversalDataModule
from engine.tools.tuning import WorkerMeasurement, WorkerRecommendation, recommend_num_workers
from task_spec import TaskSpec


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, index):
        return {"x": torch.full((4,), float(index))}


def failing_collate(rows):
    raise RuntimeError("the given collator was used")


class TestRecommendNumWorkers:
    def test_measures_every_candidate_and_picks_the_argmax(self):
        result = recommend_num_workers(Rows(), candidates=(0, 2), batch_size=4, max_batches=3)
        assert isinstance(result, WorkerRecommendation)
        assert list(result.table) == [0, 2]
        for workers, measurement in result.table.items():
            assert isinstance(measurement, WorkerMeasurement) and measurement.num_workers == workers
            assert (measurement.batches, measurement.samples) == (3, 12)
            assert measurement.seconds > 0 and measurement.samples_per_s > 0
        best = max(result.table.values(), key=lambda m: m.samples_per_s)
        assert result.num_workers == best.num_workers
        assert f"num_workers={result.num_workers}" in str(result) and "samples/s" in str(result)

    def test_uses_the_module_training_split_batch_size_and_collator(self):
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(3, 20, (40,), generator=generator)
        rows = [torch.randint(5, 500, (int(n),), generator=generator) for n in lengths]
        dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=5, val_split=0.5)
        result = recommend_num_workers(dm, candidates=(0,), max_batches=10)
        measurement = result.table[0]
        # 20 training rows in batches of 5: two warm-up batches, then the 2 that remain are timed.
        assert (measurement.batches, measurement.samples) == (2, 10)
        with pytest.raises(RuntimeError, match="the given collator was used"):
            recommend_num_workers(dm, failing_collate, candidates=(0,))

    def test_given_collate_fn_is_used_for_a_dataset(self):
        with pytest.raises(RuntimeError, match="the given collator was used"):
            recommend_num_workers(Rows(), failing_collate, candidates=(0,), batch_size=4)

    @pytest.mark.parametrize("candidates", [(), (0, -1), (0, 0), (1.5,)])
    def test_rejects_bad_candidates(self, candidates):
        with pytest.raises(ValueError, match="candidates should be"):
            recommend_num_workers(Rows(), candidates=candidates)

    def test_too_few_batches_to_time(self):
        with pytest.raises(ValueError, match="too few batches of 64 rows to time"):
            recommend_num_workers(Rows(), candidates=(0,), batch_size=64)
