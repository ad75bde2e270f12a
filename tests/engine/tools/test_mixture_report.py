"""A mixture's target against what was served: dm.report()'s mixture section and figure, repr(dm)'s mixture line,
the counts after a resume, and MixtureCallback's values in a real Lightning fit. Every served count is checked
against the rows and tokens counted in the batches the loader really yielded (web rows hold only token 1, code rows
only token 2)."""

from __future__ import annotations

import csv

import lightning
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from engine import Mixture, MixtureCallback, UniversalDataModule
from engine.tools.mixture_callback import mixture_metrics
from task_spec import TaskSpec

SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"max_seq_len": 128,
                                                                                       "vocab_size": 64})
WEB, CODE = 1, 2
"""The one token id of each source's rows, so a batch row tells its source and its tokens."""


def sources() -> dict[str, list[torch.Tensor]]:
    """Rows of varied lengths: web rows of 3 to 9 tokens of 1, code rows of 2 to 5 tokens of 2."""
    return {"web": [torch.full((3 + i % 7,), WEB, dtype=torch.long) for i in range(70)],
            "code": [torch.full((2 + i % 4,), CODE, dtype=torch.long) for i in range(40)]}


def module(mix=None, **options) -> UniversalDataModule:
    mix = {"web": 0.7, "code": 0.3} if mix is None else mix
    return UniversalDataModule(sources(), task_spec=SPEC, mix=mix, **{"batch_size": 10, "seed": 5, **options})


def counted(batches) -> dict[str, list[int]]:
    """``{source: [rows, tokens]}`` of ``batches``, read from their token ids."""
    served = {"web": [0, 0], "code": [0, 0]}
    for batch in batches:
        ids = batch["input_ids"]
        for name, token in (("web", WEB), ("code", CODE)):
            mine = (ids == token).any(dim=1)
            served[name][0] += int(mine.sum())
            served[name][1] += int((ids[mine] == token).sum())
    return served


def take(loader_iterator, count: int) -> list[dict]:
    return [next(loader_iterator) for _ in range(count)]


def served_of(numbers: dict) -> dict[str, list[int]]:
    return {name: [source["rows"], source["tokens"]] for name, source in numbers["sources"].items()}


class TestReport:
    def test_the_served_rows_and_tokens_are_those_of_the_batches_yielded(self):
        dm = module()
        batches = take(iter(dm.train_dataloader()), 4)
        numbers = dm.report().numbers["mixture"]
        expected = counted(batches)
        assert served_of(numbers) == expected and expected["web"][0] + expected["code"][0] == 40
        rows, tokens = sum(v[0] for v in expected.values()), sum(v[1] for v in expected.values())
        for name, source in numbers["sources"].items():
            assert source["row_share"] == pytest.approx(expected[name][0] / rows)
            assert source["token_share"] == pytest.approx(expected[name][1] / tokens)
        assert numbers["sources"]["web"]["weight"] == pytest.approx(0.7)
        assert numbers["sources"]["web"]["target_share"] == pytest.approx(0.7)
        assert (numbers["by"], numbers["step"], numbers["epoch"], numbers["tokens_known"]) == ("rows", 4, 0, True)

    def test_before_any_batch_nothing_is_served_and_the_target_is_the_weights(self):
        numbers = module().report().numbers["mixture"]
        assert served_of(numbers) == {"web": [0, 0], "code": [0, 0]} and numbers["step"] == 0
        assert [source["target_share"] for source in numbers["sources"].values()] == pytest.approx([0.7, 0.3])

    def test_with_workers_the_counts_are_the_batches_handed_out_not_those_prepared_ahead(self):
        dm = module(num_workers=2)
        iterator = iter(dm.train_dataloader())
        batches = take(iterator, 3)  # the workers have prepared further batches by now
        assert served_of(dm.report().numbers["mixture"]) == counted(batches)
        del iterator

    @pytest.mark.parametrize("options", [{"num_threads": 2}, {"batching": "grouped"},
                                         {"batching": "token_budget", "max_tokens": 60}], ids=str)
    def test_every_loader_and_batching_counts_the_batches_yielded(self, options):
        dm = module(**options)
        batches = take(iter(dm.train_dataloader()), 3)
        report = dm.report()
        assert served_of(report.numbers["mixture"]) == counted(batches)
        if options.get("batching") == "token_budget":  # a step holds a varying number of documents
            assert report.numbers["mixture"]["block"] == 64 and " blocks of 64 documents (epoch 0)" in str(report)
        else:
            assert "block" not in report.numbers["mixture"]

    def test_the_text_the_page_and_the_figure_show_the_numbers(self):
        dm = module()
        batches = take(iter(dm.train_dataloader()), 2)
        report = dm.report()
        expected = counted(batches)
        text = str(report)
        assert "  mixture: web=0.7, code=0.3 (by rows)" in text
        assert "  mixture now: by rows, at step 2 (epoch 0)" in text
        web = report.numbers["mixture"]["sources"]["web"]
        assert (f"  mixture web: weight now 0.7, target share 70.0%, rows served {expected['web'][0]}, row share "
                f"{web['row_share']:.1%}, tokens served {expected['web'][1]}, token share {web['token_share']:.1%}"
                in text)
        page = report._repr_html_()
        assert '<table data-section="mixture">' in page and f"<td>{expected['code'][1]}</td>" in page
        figure = page[page.index('data-plot="mixture"'):]
        figure = figure[:figure.index("</figure>")]
        assert "<svg" in figure and "target" in figure and "tokens served" in figure
        assert "web" in figure and "code" in figure

    def test_a_change_of_mixture_on_resume_is_a_step_in_the_weights_figure(self):
        first = module()
        iterator = iter(first.train_dataloader())
        before = take(iterator, 3)
        state = first.state_dict()
        changed = module(Mixture({"web": 0.5, "code": 0.5}, on_change="continue"))
        changed.load_state_dict(state)
        after = take(iter(changed.train_dataloader()), 2)
        report = changed.report()
        numbers = report.numbers["mixture"]
        both = counted(before + after)
        assert served_of(numbers) == both and both["code"][0] == 9 + 10
        assert numbers["history"] == [{"step": 3, "weights": {"web": 0.7, "code": 0.3}}]
        by_step = numbers["weights_by_step"]
        assert by_step["changes"] == [3] and by_step["steps"] == [0, 2, 3, 5]
        assert by_step["weights"] == {"web": [0.7, 0.7, 0.5, 0.5], "code": [0.3, 0.3, 0.5, 0.5]}
        assert ("  mixture changed at step 3 from a checkpoint of another mixture (weights before: web=0.7, "
                "code=0.3)") in str(report)
        page = report._repr_html_()
        figure = page[page.index('data-plot="mixture-weights"'):]
        figure = figure[:figure.index("</figure>")]
        assert "<svg" in figure and "another mixture" in figure and "web" in figure

    def test_constant_weights_draw_no_weights_figure(self):
        dm = module()
        take(iter(dm.train_dataloader()), 2)
        assert 'data-plot="mixture-weights"' not in dm.report()._repr_html_()

    def test_the_repr_names_the_sources_weights_and_schedule_in_one_line(self):
        dm = module(Mixture({"web": 3, "code": 1}, by="tokens", schedule=[(10, {"web": 1, "code": 1})],
                            exhaust={"web": "cycle", "code": "stop"}))
        lines = [line for line in repr(dm).splitlines() if "mixture" in line]
        assert lines == ["  mixture: web=0.75, code=0.25 (by tokens; schedule: 1 change up to step 10; exhaust: "
                         "web=cycle, code=stop)"]

    def test_a_schedule_shows_the_current_weights_and_the_target_over_the_steps_served(self):
        dm = module(Mixture({"web": 0.8, "code": 0.2}, schedule=[(2, {"web": 0.4, "code": 0.6})]))
        batches = take(iter(dm.train_dataloader()), 4)
        numbers = dm.report().numbers["mixture"]
        assert [source["weight"] for source in numbers["sources"].values()] == pytest.approx([0.4, 0.6])
        assert numbers["sources"]["web"]["target_share"] == pytest.approx((0.8 + 0.8 + 0.4 + 0.4) / 4)
        assert served_of(numbers) == counted(batches) and counted(batches)["web"][0] == 8 + 8 + 4 + 4

    @pytest.mark.parametrize("batching", ["plain", "grouped"])
    def test_the_padding_shares_are_those_of_the_mixture_the_loader_serves(self, batching):
        real = positions = 0
        for batch in module(batching=batching).train_dataloader():  # epoch 0, as the report reads it
            real += int(batch["attention_mask"].sum())
            positions += batch["attention_mask"].numel()
        padding = module(batching=batching).report().numbers["padding"]
        assert padding["chosen"] == pytest.approx(1 - real / positions)
        if batching == "plain":
            assert padding["plain"] == pytest.approx(1 - real / positions)

    def test_by_tokens_the_token_shares_follow_the_weights_and_the_row_shares_do_not(self):
        dm = module(Mixture({"web": 0.5, "code": 0.5}, by="tokens"))  # web rows are longer: fewer of them
        batches = take(iter(dm.train_dataloader()), 5)
        numbers = dm.report().numbers["mixture"]
        assert numbers["by"] == "tokens" and served_of(numbers) == counted(batches)
        web = numbers["sources"]["web"]
        assert abs(web["token_share"] - 0.5) <= 9 / sum(counted(batches)["web"][1:] + counted(batches)["code"][1:])
        assert web["row_share"] < 0.45

    def test_a_module_without_a_mixture_has_no_mixture_section(self):
        dm = UniversalDataModule(sources()["web"], task_spec=SPEC, batch_size=10)
        report = dm.report()
        assert report.numbers["mixture"] is None
        assert 'data-plot="mixture"' not in report._repr_html_() and "mixture" not in str(report)
        assert "mixture" not in repr(dm)


class TestResume:
    def test_the_counts_go_on_from_the_saved_ones(self):
        first = module()
        before = take(iter(first.train_dataloader()), 3)
        state = first.state_dict()
        resumed = module()
        resumed.load_state_dict(state)
        assert served_of(resumed.report().numbers["mixture"]) == counted(before)
        after = take(iter(resumed.train_dataloader()), 4)
        numbers = resumed.report().numbers["mixture"]
        assert served_of(numbers) == counted(before + after) and numbers["step"] == 7
        whole = module()
        assert served_of(numbers) == counted(take(iter(whole.train_dataloader()), 7))

    def test_the_counts_go_on_across_epochs(self):
        dm = module()
        loader = dm.train_dataloader()
        batches = [batch for _ in range(2) for batch in loader]  # two whole epochs
        state = dm.state_dict()
        resumed = module()
        resumed.load_state_dict(state)
        numbers = resumed.report().numbers["mixture"]
        assert served_of(numbers) == counted(batches) and numbers["epoch"] == 2


class TinyLM(lightning.LightningModule):
    """Embedding + linear model that keeps every training batch it is given."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(64, 8), nn.Linear(8, 64)
        self.seen: list[dict] = []

    def training_step(self, batch, batch_index):
        self.seen.append({"input_ids": batch["input_ids"].clone()})
        logits = self.head(self.embed(batch["input_ids"]))
        return nn.functional.cross_entropy(logits.reshape(-1, 64), batch["labels"].clamp(min=0).reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(callback, tmp_path, **options):
    return lightning.Trainer(accelerator="cpu", devices=1, logger=CSVLogger(tmp_path, name="mix"),
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[callback], **options)


def logged_rows(fitted) -> list[dict[str, str]]:
    with open(f"{fitted.logger.log_dir}/metrics.csv", newline="") as file:
        return [row for row in csv.DictReader(file) if row.get("mixture/web/rows")]


def expected_metrics(batches, weights=(0.7, 0.3), steps=None) -> dict[str, float]:
    served = counted(batches)
    rows, tokens = sum(v[0] for v in served.values()), sum(v[1] for v in served.values())
    metrics = {}
    for (name, (row_count, token_count)), weight in zip(served.items(), weights):
        metrics.update({f"mixture/{name}/weight": weight, f"mixture/{name}/target_share": weight,
                        f"mixture/{name}/rows": row_count, f"mixture/{name}/row_share": row_count / rows,
                        f"mixture/{name}/tokens": token_count, f"mixture/{name}/token_share": token_count / tokens})
    return metrics


class TestCallback:
    def test_it_logs_on_the_steps_lightning_writes_the_served_counts_of_the_batches_trained_on(self, tmp_path):
        dm, model, callback = module(), TinyLM(), MixtureCallback()
        fitted = trainer(callback, tmp_path, max_steps=6, log_every_n_steps=2)
        fitted.fit(model, datamodule=dm)
        rows = logged_rows(fitted)
        assert [int(row["step"]) for row in rows] == [1, 3, 5]  # after batches 2, 4 and 6
        for row in rows:
            expected = expected_metrics(model.seen[:int(row["step"]) + 1])
            assert {name: float(row[name]) for name in expected} == pytest.approx(expected)
        assert callback.last_logged == pytest.approx(expected_metrics(model.seen))
        assert set(callback.last_logged) == set(expected_metrics(model.seen))
        assert float(fitted.callback_metrics["mixture/code/tokens"]) == counted(model.seen)["code"][1]

    def test_counts_past_float32_reach_the_log_exactly(self, tmp_path, monkeypatch):
        big = 2**24 + 1  # the first integer float32 cannot hold
        summary = {"tokens_known": True, "sources": {"web": {"weight": 1.0, "target_share": 1.0, "rows": big,
                                                              "row_share": 1.0, "tokens": big, "token_share": 1.0}}}
        monkeypatch.setattr("engine.tools.mixture_callback.served_summary", lambda loader: summary)
        fitted = trainer(MixtureCallback(), tmp_path, max_steps=1, log_every_n_steps=1)
        fitted.fit(TinyLM(), datamodule=module())
        assert float(logged_rows(fitted)[-1]["mixture/web/tokens"]) == big

    def test_its_own_interval_and_the_counts_after_a_resume(self, tmp_path):
        first = module()
        before = take(iter(first.train_dataloader()), 3)
        dm = module()
        dm.load_state_dict(first.state_dict())
        model, callback = TinyLM(), MixtureCallback(log_every_n_steps=3, prefix="data/mix/")
        fitted = trainer(callback, tmp_path, max_steps=7, log_every_n_steps=1)
        fitted.fit(model, datamodule=dm)
        with open(f"{fitted.logger.log_dir}/metrics.csv", newline="") as file:
            logged = [row for row in csv.DictReader(file) if row.get("data/mix/web/rows")]
        assert int(logged[0]["step"]) == 2  # first logged after batch 3 of this run
        for row in logged:  # Lightning writes the last value logged on each later step: batches 3, or 6 from step 5
            served = counted(before + model.seen[:3 * ((int(row["step"]) + 1) // 3)])
            assert [float(row["data/mix/web/rows"]), float(row["data/mix/code/tokens"])] == [served["web"][0],
                                                                                              served["code"][1]]

    def test_the_metrics_leave_tokens_out_where_they_are_unknown(self):
        summary = {"tokens_known": False, "sources": {"a": {"weight": 1.0, "target_share": 1.0, "rows": 3,
                                                            "row_share": 1.0, "tokens": 0, "token_share": 0.0}}}
        assert mixture_metrics(summary, "m/") == {"m/a/weight": 1.0, "m/a/target_share": 1.0, "m/a/rows": 3.0,
                                                  "m/a/row_share": 1.0}

    def test_a_trainer_without_a_mixture_is_refused_at_setup(self, tmp_path):
        dm = UniversalDataModule(sources()["web"], task_spec=SPEC, batch_size=10)
        with pytest.raises(TypeError, match=r"MixtureCallback logs the served shares of a UniversalDataModule's "
                                            r"mixture, but the trainer's datamodule is UniversalDataModule without "
                                            r"one"):
            trainer(MixtureCallback(), tmp_path, max_steps=1).fit(TinyLM(), datamodule=dm)

    def test_log_every_n_steps_is_checked(self):
        with pytest.raises((TypeError, ValueError), match="log_every_n_steps"):
            MixtureCallback(log_every_n_steps=0)
