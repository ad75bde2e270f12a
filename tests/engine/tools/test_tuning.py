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
        assert list(result.threads_table) == [1] and result.threads_table[1].num_threads == 1
        assert (result.threads_table[1].batches, result.threads_table[1].samples) == (3, 12)
        best = max(result.measurements, key=lambda m: m.samples_per_s)
        assert (result.num_workers, result.num_threads) == (best.num_workers, best.num_threads)
        assert result.loader_options == {"num_workers": best.num_workers, "num_threads": best.num_threads}
        assert f"{best.mode}: highest measured throughput" in str(result) and "samples/s" in str(result)

    def test_with_a_step_the_mode_that_adds_least_to_it_wins_and_says_why(self):
        result = recommend_num_workers(Rows(), candidates=(0,), threads=(1, 2), step_s=0.002, batch_size=4,
                                       max_batches=4)
        assert [m.mode for m in result.measurements] == ["num_workers=0", "num_threads=1", "num_threads=2"]
        for measurement in result.measurements:
            assert measurement.step_s == 0.002 and measurement.seconds >= 4 * 0.002
            assert measurement.loading_per_batch_s == measurement.seconds / 4 - 0.002
        best = min(result.measurements, key=lambda m: m.loading_per_batch_s)
        assert (result.num_workers, result.num_threads) == (best.num_workers, best.num_threads)
        assert "adds the least to a 2.0 ms step" in result.reason
        assert ("threads prepare batches" in result.reason) == bool(result.num_threads)

    def test_threads_can_be_left_out(self):
        result = recommend_num_workers(Rows(), candidates=(0,), threads=(), batch_size=4, max_batches=2)
        assert result.threads_table == {} and result.num_threads == 0

    @pytest.mark.parametrize(("option", "value"), [("threads", (0,)), ("threads", (1, 1)), ("step_s", -1.0),
                                                   ("step_s", "10ms")])
    def test_rejects_bad_threads_and_step(self, option, value):
        with pytest.raises(ValueError, match=f"{option} should be"):
            recommend_num_workers(Rows(), candidates=(0,), batch_size=4, **{option: value})

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
