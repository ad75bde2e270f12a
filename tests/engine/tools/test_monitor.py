import time

import lightning
import pytest
import torch

from engine import DataLoaderConfig, DataLoaderFactory, UniversalDataModule
from engine.tools.monitor import DataMonitor, MonitorStats, batch_counts
from engine.tools.monitor_callback import DataMonitorCallback
from task_spec import TaskSpec


def text_batches():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # 6 real tokens of 8 positions
    return [{"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": mask}] * 3


def slow_batches(count, pause):
    for _ in range(count):
        time.sleep(pause)
        yield torch.zeros(4, 2)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return torch.full((3,), float(index))


class TestBatchCounts:
    def test_mask_gives_tokens_and_padding(self):
        assert batch_counts(text_batches()[0]) == (2, 6, 6, 8)

    def test_without_mask_tokens_are_the_id_count(self):
        assert batch_counts({"input_ids": torch.ones(3, 5, dtype=torch.long)}) == (3, 15, 0, 0)

    def test_tuples_and_bare_tensors_count_rows(self):
        assert batch_counts((torch.zeros(7, 2), torch.zeros(7)))[0] == 7
        assert batch_counts(torch.zeros(5, 3))[0] == 5


class TestDataMonitor:
    def test_wrap_counts_samples_tokens_and_padding(self):
        monitor = DataMonitor()
        batches = list(monitor.wrap(text_batches()))
        assert len(batches) == 3
        stats = monitor.stats()
        assert isinstance(stats, MonitorStats)
        assert (stats.batches, stats.samples, stats.tokens) == (3, 6, 18)
        assert stats.padding_share == pytest.approx(0.25)
        assert stats.samples_per_s == pytest.approx(stats.samples / stats.elapsed_s)
        assert stats.tokens_per_s == pytest.approx(18 / stats.elapsed_s)
        assert stats.rss_mb > 0 and stats.peak_rss_mb >= stats.rss_mb

    def test_wait_is_the_time_inside_next(self):
        monitor = DataMonitor()
        for _ in monitor.wrap(slow_batches(3, 0.01)):
            pass
        stats = monitor.stats()
        assert stats.wait_s >= 0.03  # each next() slept 10 ms before returning
        assert stats.wait_s <= stats.elapsed_s and 0 < stats.wait_share <= 1

    def test_no_mask_means_unknown_padding(self):
        monitor = DataMonitor()
        list(monitor.wrap([{"input_ids": torch.ones(2, 3, dtype=torch.long)}]))
        stats = monitor.stats()
        assert stats.padding_share is None and stats.tokens == 6
        assert "padding_share" not in stats.as_dict() and stats.as_dict()["tokens"] == 6.0
        assert "padding n/a" in str(stats)

    def test_context_manager_freezes_the_clock_and_resets(self):
        monitor = DataMonitor()
        list(monitor.wrap(text_batches()))
        with monitor:
            assert monitor.batches == 0
            list(monitor.wrap(text_batches()[:1]))
        first, second = monitor.stats(), monitor.stats()
        assert first.batches == 1 and first.elapsed_s == second.elapsed_s
        assert "1 batches in" in str(first) and "batches/s" in str(first)

    def test_worker_memory_is_measured_while_workers_run(self):
        loader = DataLoaderFactory().create_dataloader(Rows(), DataLoaderConfig(batch_size=4, num_workers=2))
        monitor = DataMonitor(memory_every=1)
        worker_mb = []
        for _ in monitor.wrap(loader):
            worker_mb.append(monitor.worker_rss_mb)
        assert all(mb > 0 for mb in worker_mb)
        assert monitor.stats().samples == 16

    def test_rejects_bad_memory_interval(self):
        with pytest.raises(ValueError, match="memory_every should be a positive integer, but got memory_every=0"):
            DataMonitor(memory_every=0)


class TinyLM(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(600, 4)

    def training_step(self, batch, batch_idx):
        return self.embed(batch["input_ids"] % 600).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TestDataMonitorCallback:
    @pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader`")
    def test_logs_data_metrics_through_lightning(self):
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(3, 20, (24,), generator=generator)
        rows = [torch.randint(5, 500, (int(n),), generator=generator) for n in lengths]
        dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        callback = DataMonitorCallback(log_every_n_steps=2, memory_every=1)
        trainer = lightning.Trainer(max_epochs=1, callbacks=[callback], logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        trainer.fit(TinyLM(), datamodule=dm)
        real_tokens = sum(len(row) for row in rows)
        assert callback.monitor.batches == 6 and callback.monitor.samples == 24
        assert callback.monitor.tokens == real_tokens
        metrics = trainer.callback_metrics
        assert metrics["data/batches"].item() == 6 and metrics["data/samples"].item() == 24
        assert metrics["data/tokens"].item() == real_tokens
        assert 0 < metrics["data/padding_share"].item() < 1
        assert metrics["data/wait_s"].item() > 0 and metrics["data/rss_mb"].item() > 0
        assert set(callback.last_logged) >= {"data/batches_per_s", "data/samples_per_s", "data/tokens_per_s",
                                              "data/wait_share", "data/worker_rss_mb"}
        waits, steps = callback.monitor.timeline()  # every step closed by on_train_batch_end
        assert len(waits) == len(steps) == 6 and all(step >= wait >= 0 for wait, step in zip(waits, steps))

    def test_rejects_bad_log_interval(self):
        with pytest.raises(ValueError, match="log_every_n_steps should be a positive integer"):
            DataMonitorCallback(log_every_n_steps=0)


class FakeClock:
    """``time.perf_counter`` for the monitor, advanced by hand: waits and steps become exact numbers."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


class TestTimeline:
    def clocked(self, monkeypatch):
        from engine.tools import monitor as monitor_module

        clock = FakeClock()
        monkeypatch.setattr(monitor_module, "time", clock)
        return clock, DataMonitor()

    def test_wrap_records_each_wait_and_each_whole_step(self, monkeypatch):
        clock, monitor = self.clocked(monkeypatch)
        waits, work = [0.5, 0.0, 2.0], [1.0, 3.0, 0.25]

        def loader():
            for wait in waits:
                clock.now += wait  # the time next() takes
                yield {"input_ids": torch.ones(2, 3, dtype=torch.long)}

        for index, _ in enumerate(monitor.wrap(loader())):
            clock.now += work[index]  # the training step's own work
        assert monitor.timeline() == (waits, [wait + busy for wait, busy in zip(waits, work)])

    def test_a_step_not_yet_ended_is_left_out(self, monkeypatch):
        clock, monitor = self.clocked(monkeypatch)
        monitor.record(torch.zeros(2, 1), wait_s=0.0)
        clock.now += 1.0
        assert monitor.timeline() == ([], [])
        monitor.record(torch.zeros(2, 1), wait_s=0.5)  # asked for at now - 0.5: the first step ended there
        assert monitor.timeline() == ([0.0], [0.5])
        clock.now += 2.0
        monitor.end_step()
        assert monitor.timeline() == ([0.0, 0.5], [0.5, 2.5])

    def test_plot_timeline_draws_one_svg_figure(self, tmp_path):
        monitor = DataMonitor()
        for _ in monitor.wrap(text_batches()):
            pass
        figure = monitor.plot_timeline()
        page = figure._repr_html_()
        assert page.startswith('<figure class="udm-plot" data-plot="wait-timeline"><svg') and page.count("<svg") == 1
        assert "data wait per step" in page and "waiting for data" in page
        saved = figure.save(tmp_path / "timeline.html").read_text(encoding="utf-8")
        assert saved.startswith("<!doctype html>") and page in saved

    def test_plot_timeline_before_any_step_says_what_to_do(self):
        with pytest.raises(ValueError, match=r"the monitor has timed no step yet; iterate monitor.wrap\(loader\)"):
            DataMonitor().plot_timeline()
