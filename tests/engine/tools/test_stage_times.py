"""Stage times: a loader times each batch's fetch, decode (the per-row transform) and collate where they run (in
this process, in threads and in worker processes, whose times travel back with the batch), the monitor times the
transfer, in a plain loop and in Lightning, as a stage of its own outside the wait; the loader's stages add up to
within the wait the monitor measured around ``next()``; every rank's wait in one
table with its imbalance, in the monitor's summary and the HTML report (two real processes:
tests/distributed/test_rank_waits.py)."""

import pickle
import time

import datasets
import lightning
import pytest
import torch

from engine import UniversalDataModule
from engine.core.stage_times import STAGES, StageTimes
from engine.tools.monitor import DataMonitor
from engine.tools.monitor_callback import DataMonitorCallback
from engine.tools.rank_waits import RankWait, RankWaits
from tests.engine.test_resume import SPEC, rows
from tests.engine.tools.test_monitor import TinyLM


def identity(row):
    return row


def module(**options):
    return UniversalDataModule(rows(), task_spec=SPEC, batch_size=8, seed=3, **options)


def monitored(loader, **wrap):
    with DataMonitor() as monitor:
        batches = list(monitor.wrap(loader, **wrap))
    return monitor, batches


class Clock:
    """``time.perf_counter`` as a clock that moves only when a test advances it."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)

    def advance(self, seconds):
        self.now += seconds


class TestStageTimes:
    def test_a_stage_timed_apart_counts_no_new_batch(self):
        times = StageTimes()
        times.add({"fetch": 0.001, "collate": 0.003})
        times.add_stage("transfer", 0.004)
        assert times.batches == 1 and times.counts == {"fetch": 1, "collate": 1, "transfer": 1}
        assert times.total("transfer") == 0.004 and times.total("decode") == 0.0
        assert times.mean_ms() == pytest.approx({"fetch": 1.0, "collate": 3.0, "transfer": 4.0})

    def test_sums_counts_and_means(self):
        times = StageTimes()
        times.add({"fetch": 0.001, "collate": 0.003})
        before = times.snapshot()
        times.add({"fetch": 0.003, "decode": 0.002, "collate": 0.001})
        assert times.batches == 2 and times.counts == {"fetch": 2, "collate": 2, "decode": 1}
        assert list(times.totals()) == ["fetch", "decode", "collate"]  # in the order of STAGES
        assert times.mean_ms() == pytest.approx({"fetch": 2.0, "decode": 2.0, "collate": 2.0})
        assert times.mean_ms(since=before) == pytest.approx({"fetch": 3.0, "decode": 2.0, "collate": 1.0})

    def test_pickles_without_its_lock_for_spawned_workers(self):
        times = StageTimes()
        times.add({"fetch": 0.5})
        copy = pickle.loads(pickle.dumps(times))
        copy.add({"fetch": 0.5})
        assert copy.totals() == {"fetch": 1.0} and times.totals() == {"fetch": 0.5}


class TestLoaderStages:
    @pytest.mark.parametrize("transform", [None, identity])
    def test_in_process_stages_add_up_to_within_the_wait(self, transform):
        loader = module(train_transform=transform).train_dataloader()
        monitor, batches = monitored(loader)
        times = loader.stage_times
        expected = ["fetch", "decode", "collate"] if transform else ["fetch", "collate"]
        assert times.batches == len(batches) == 6 and list(times.totals()) == expected
        assert all(times.counts[stage] == 6 for stage in expected)
        assert sum(times.totals().values()) <= monitor.wait_s  # each stage ran inside next()
        assert list(monitor.stats().stages_ms) == expected

    def test_worker_stages_come_back_with_the_batches(self):
        loader = module(num_workers=2, train_transform=identity).train_dataloader()
        monitor, batches = monitored(loader)
        times = loader.stage_times
        assert times.batches == len(batches) == 6 and list(times.totals()) == ["fetch", "decode", "collate"]
        # two workers ran side by side: their busy time is at most twice the time the pass took
        assert sum(times.totals().values()) <= 2 * monitor.stats().elapsed_s
        assert batches[0]["input_ids"].dtype == torch.long  # the batches themselves, unwrapped

    def test_a_streams_worker_stages_come_back_too(self):
        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 12}).to_iterable_dataset(num_shards=2)
        loader = UniversalDataModule(stream, task_spec=SPEC, batch_size=2, num_workers=2, seed=3).train_dataloader()
        batches = list(loader)
        assert all(isinstance(batch, dict) for batch in batches)  # unwrapped in the parent
        assert loader.stage_times.batches == len(batches) == 6 and "collate" in loader.stage_times.totals()

    def test_thread_stages(self):
        loader = module(num_threads=1).train_dataloader()
        monitor, batches = monitored(loader)
        assert loader.stage_times.batches == len(batches) and list(loader.stage_times.totals()) == ["fetch",
                                                                                                    "collate"]

    def test_the_monitor_times_the_transfer_as_a_stage_of_its_own(self):
        monitor, batches = monitored(module().train_dataloader(), device="cpu")
        stats = monitor.stats()
        assert list(stats.stages_ms) == ["fetch", "collate", "transfer"] and stats.stages_ms["transfer"] > 0
        assert {"stage_fetch_ms", "stage_collate_ms", "stage_transfer_ms"} <= set(stats.as_dict())
        assert "per batch: fetch" in str(stats) and "transfer" in str(stats)

    def test_a_transfer_needs_a_device(self):
        with pytest.raises(ValueError, match=r"device should be given with transfer= .*, but got device=None"):
            next(DataMonitor().wrap(module().train_dataloader(), transfer=module().transfer))

    def test_the_wait_leaves_the_modules_transfer_out(self, monkeypatch):
        clock = Clock(monkeypatch)
        dm = module()

        def transfer(batch, device):  # the module's hooks, taking 5 s of the clock that the monitor reads
            clock.advance(5.0)
            return dm.transfer(batch, device)

        monitor, batches = monitored(dm.train_dataloader(), device="cpu", transfer=transfer)
        assert len(batches) == 6 and monitor.stats().stages_ms["transfer"] == 5000.0
        assert monitor.wait_s == 0.0  # by construction: the clock moved only in the transfer
        waits, steps = monitor.timeline()
        assert waits == [0.0] * 6 and steps == [5.0] * 6  # each step still starts where its wait did

    def test_a_reset_reports_only_the_batches_after_it(self):
        loader = module().train_dataloader()
        monitor = DataMonitor()
        list(monitor.wrap(loader))
        monitor.reset()
        assert monitor.stats().stages_ms == {}
        list(monitor.wrap(loader))
        assert set(monitor.stats().stages_ms) == {"fetch", "collate"}


class TestRankWaits:
    def table(self):
        return RankWaits((RankWait(0, 10, 1.0, 5.0, 200.0, {"fetch": 1.5, "collate": 2.0}),
                          RankWait(1, 10, 3.0, 5.0, 900.0, {"fetch": 4.0})))

    def test_imbalance_is_the_largest_wait_over_the_mean(self):
        table = self.table()
        assert table.imbalance == 1.5 and table.slowest == 1
        assert RankWaits((RankWait(0, 0, 0.0, 0.0, 0.0),)).imbalance == 1.0

    def test_a_rank_travels_as_a_vector(self):
        for rank in self.table().ranks:
            assert RankWait.from_vector(rank.as_vector()) == rank
        assert len(rank.as_vector()) == 5 + len(STAGES)

    def test_text_and_html_hold_every_rank(self):
        table = self.table()
        text = str(table).splitlines()
        assert text[0].split() == ["rank", "batches", "wait", "s", "wait/batch", "ms", "max", "wait", "ms", "fetch",
                                   "ms", "collate", "ms"]
        assert text[1].split()[:4] == ["0", "10", "1.000", "100.00"] and text[2].split()[-1] == "-"
        assert text[-1] == "wait imbalance across 2 ranks: 1.50 (max/mean), slowest rank 1"
        assert table.to_html().count("<tr>") == 3

    def test_one_process_gathers_its_own(self):
        monitor, _ = monitored(module().train_dataloader())
        table = monitor.rank_waits()
        assert [rank.rank for rank in table.ranks] == [0] and table.ranks[0].wait_s == monitor.wait_s
        assert "wait imbalance across 1 rank: 1.00" in str(monitor.stats(gather=True))

    def test_the_report_shows_the_table(self, tmp_path):
        report = module().report().with_waits(self.table())
        assert "waiting for data, per rank:" in str(report) and "slowest rank 1" in str(report)
        page = report.save(tmp_path / "report.html").read_text()
        assert "waiting for data, per rank" in page and "1.50 (max/mean)" in page


def fit(dm, **trainer):
    callback = DataMonitorCallback(log_every_n_steps=2)
    trainer = lightning.Trainer(max_epochs=1, callbacks=[callback], logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **trainer)
    trainer.fit(TinyLM(), datamodule=dm)
    return trainer, callback


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader`")
def test_the_callback_logs_stage_times_and_the_imbalance():
    dm = module(val_split=5)
    trainer, callback = fit(dm)
    assert {"data/stage_fetch_ms", "data/stage_collate_ms", "data/stage_transfer_ms",
            "data/wait_imbalance"} <= set(callback.last_logged)
    assert callback.last_logged["data/stage_transfer_ms"] > 0
    assert trainer.callback_metrics["data/wait_imbalance"].item() == 1.0
    assert [rank.rank for rank in callback.rank_waits.ranks] == [0] and callback.rank_waits.ranks[0].batches == 5
    assert "transfer" in callback.rank_waits.ranks[0].stages_ms and "transfer ms" in str(callback.rank_waits)
    times = trainer.train_dataloader.stage_times
    assert times.counts["transfer"] == times.batches == 5  # the training batches' copies; validation's not counted


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader`")
def test_in_lightning_the_transfer_is_a_stage_the_wait_leaves_out(monkeypatch):
    clock = Clock(monkeypatch)
    dm = module()

    def normalize(batch):  # the module's after-transfer hook, taking 5 s of the clock the callback reads
        clock.advance(5.0)
        return batch

    dm.device_normalize = normalize
    trainer, callback = fit(dm, limit_train_batches=3)
    monitor = callback.monitor
    assert monitor.batches == 3 and monitor.stages_ms()["transfer"] == 5000.0
    assert monitor.wait_s == 0.0  # by construction: the clock moved only inside the transfer hooks
    assert callback.last_logged["data/stage_transfer_ms"] == 5000.0 and callback.last_logged["data/wait_s"] == 0.0
    waits, steps = monitor.timeline()
    assert waits == [0.0] * 3 and steps == [5.0] * 3  # the step starts where its wait did, before the transfer
