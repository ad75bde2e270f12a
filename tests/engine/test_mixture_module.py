"""A module that mixes named sources inside every batch: the declared shares in every batch, every batching mode,
the same batches at any worker count, exact and elastic resume, schedules from their step, a changed mixture
refused, resumed from the next epoch or gone on with in its epoch, splits per source, and the refusals at
construction."""

import pickle

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from collators.columns import ColumnBatch
from engine import Mixture, Shards, UniversalDataModule
from engine.loading.factory import batch_sampler_for
from task_spec import TaskSpec
from tests.engine.sources.shards.shard_corpus import SPEC as CORPUS_SPEC
from tests.engine.sources.shards.shard_corpus import write_corpus

SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 64})
TAGS = {"web": 1, "code": 2, "books": 3}


class Tagged(Dataset):
    """Rows whose tokens are all the source's tag, and which carry their own id."""

    def __init__(self, tag, count):
        self.tag, self.count = tag, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return {"input_ids": torch.full((2 + index % 5,), self.tag), "row_id": index}


def sources(web=70, code=30, books=None):
    data = {"web": Tagged(1, web), "code": Tagged(2, code)}
    if books:
        data["books"] = Tagged(3, books)
    return data


def module(mix=None, workers=0, data=None, **options):
    options.setdefault("batch_size", 10)
    return UniversalDataModule(data or sources(), task_spec=SPEC, mix=mix or {"web": 0.7, "code": 0.3}, seed=7,
                               num_workers=workers, **options)


def served(batch):
    """``(source tag, row id)`` of each row of a padded batch."""
    return [(int(ids[0]), int(row)) for ids, row in zip(batch["input_ids"], batch["row_id"])]


def run(dm, steps):
    """The first ``steps`` batches from where the module's loader stands, across epochs."""
    loader, out = dm.train_dataloader(), []
    while len(out) < steps:
        for batch in loader:
            out.append(served(batch))
            if len(out) == steps:
                break
    return out


def documents(batch):
    """``(source tag, row id)`` of each row of a batch (its lists), padded or packed (``[1, T]``, documents at
    ``cu_seq_lens_q``)."""
    if "cu_seq_lens_q" in batch:
        return [(batch["input_ids"][0][start], row) for start, row in zip(batch["cu_seq_lens_q"], batch["row_id"])]
    return [(ids[0], row) for ids, row in zip(batch["input_ids"], batch["row_id"])]


def mixture_state(dm):
    """The mixture's part of the train sampler's state in ``dm.data_state()`` (with workers: the loader's main
    process snapshot)."""
    loader = dm.data_state()["train_loader"]
    return loader.get("_snapshot", {}).get("_main_snapshot", loader)["_index_sampler_state"]["mixture"]


def counts(batch_rows):
    return {tag: sum(1 for source, _ in batch_rows if source == tag) for tag in (1, 2)}


def test_every_batch_holds_the_declared_shares():
    batches = run(module(), 10)
    assert all(counts(batch) == {1: 7, 2: 3} for batch in batches)
    rows = [row for batch in batches for row in batch]
    assert sorted(row for tag, row in rows if tag == 1) == list(range(70))  # one pass over each source
    assert sorted(row for tag, row in rows if tag == 2) == list(range(30))


def test_a_hugging_face_dataset_and_a_list_of_tensors_mix():
    web = datasets.Dataset.from_dict({"input_ids": [[1] * (2 + i % 4) for i in range(40)]})
    code = [torch.full((3,), 2) for _ in range(60)]
    dm = UniversalDataModule({"web": web, "code": code}, task_spec=SPEC, mix={"web": 1, "code": 1}, batch_size=8)
    batch = next(iter(dm.train_dataloader()))
    assert sorted(set(batch["input_ids"][:, 0].tolist())) == [1, 2]
    assert int((batch["input_ids"][:, 0] == 1).sum()) == 4


def test_the_same_batches_at_any_number_of_workers():
    assert run(module(workers=2), 12) == run(module(workers=0), 12)


@pytest.mark.parametrize("batching", ["grouped", "token_budget", "packed"])
def test_every_batching_mode_serves_each_row_of_the_epoch_once(batching):
    options = {"batching": batching, "batch_size": 10} if batching == "grouped" else {
        "batching": batching, "max_tokens": 40}
    dm = module(**options)
    loader = dm.train_dataloader()
    rows = []
    for batch in loader:
        if batching == "packed":  # one [1, T] sequence: the row ids of its documents
            rows += [(TAGS["web"] if tag == 1 else 2, int(row)) for tag, row in
                     zip(batch["document_tags"], batch["row_id"])] if "document_tags" in batch else []
        else:
            rows += served(batch)
    if batching != "packed":
        assert sorted(rows) == sorted([(1, i) for i in range(70)] + [(2, i) for i in range(30)])
    sampler = loader.batch_sampler
    order = sampler.mixture.order(0)
    assert sorted(row for batch in sampler.epoch_batches(0) for row in batch) == sorted(order.tolist())


def test_resume_continues_exactly_with_the_served_counts():
    reference = run(module(), 10)
    first = module()
    assert run(first, 4) == reference[:4]
    state = pickle.loads(pickle.dumps(first.data_state()))
    resumed = module(workers=2)
    resumed.load_state_dict(state)
    assert run(resumed, 6) == reference[4:]
    sampler = resumed.train_dataloader().batch_sampler
    summary = sampler.mixture.summary(sampler)
    assert {name: source["rows"] for name, source in summary["sources"].items()} == {"web": 70, "code": 30}


@pytest.mark.parametrize(("batching", "options"), [("plain", {"batch_size": 4}), ("grouped", {"batch_size": 4}),
                                                   ("token_budget", {"max_tokens": 24})])
def test_a_state_of_two_ranks_resumes_on_one_serving_the_rest_of_the_epoch_once(batching, options):
    dm = module(batching=batching, **options)
    dm.setup()
    source = dm.datasets["train"]
    from engine.datamodule.mixing import mixture_order

    def sampler(replicas, rank):
        size = options.get("batch_size", 0) * 2 // replicas or None
        order = mixture_order(dm.mixture, source, batching=batching, key="input_ids",
                              global_batch=(size or 1) * replicas, seed=dm.seed)
        return batch_sampler_for(source, batching=batching, batch_size=size or 1, seed=dm.seed, key="input_ids",
                                 max_tokens=options.get("max_tokens", 0) * 2 // replicas or None,
                                 num_replicas=replicas, rank=rank, order=order)

    ranks = [sampler(2, rank) for rank in (0, 1)]
    iterators = [iter(one) for one in ranks]
    before = [row for _ in range(3) for it in iterators for row in next(it)]  # 3 steps on 2 ranks
    state = ranks[0].state_dict()
    assert state["mixture"]["served"]["web"][0] + state["mixture"]["served"]["code"][0] == len(before)
    alone = sampler(1, 0)
    alone.load_state_dict(state)
    rest = list(alone)
    after = [row for batch in rest for row in batch]
    whole = sampler(1, 0).mixture.order(0)
    if batching == "plain":  # a step is a block on any number of ranks: the rest is the uninterrupted run's
        assert [sorted(batch) for batch in rest] == [sorted(batch) for batch in list(sampler(1, 0))[3:]]
    assert sorted(before + after) == sorted(whole.tolist())  # every row of the epoch once, across topologies
    summary = alone.mixture.summary(alone)
    assert sum(one["rows"] for one in summary["sources"].values()) == len(before) + len(after)


def test_a_schedule_switch_serves_the_new_weights_from_its_step():
    dm = module(Mixture({"web": 0.7, "code": 0.3}, schedule=[(4, {"web": 0.2, "code": 0.8})], exhaust="cycle"))
    batches = run(dm, 8)
    assert [counts(batch) for batch in batches] == [{1: 7, 2: 3}] * 4 + [{1: 2, 2: 8}] * 4


def test_a_state_of_another_mixture_is_refused_naming_what_changed():
    first = module()
    run(first, 3)
    state = first.data_state()
    other = module({"web": 0.5, "code": 0.5})
    with pytest.raises(ValueError, match=r"another mixture \(weights: saved \{'web': 0.7, 'code': 0.3\}, now "
                                         r"\{'web': 0.5, 'code': 0.5\}\).*on_change='new_epoch'"):
        other.load_state_dict(state)
        run(other, 1)


def test_a_new_source_joins_from_the_next_epoch_keeping_the_served_counts():
    first = module()
    run(first, 3)
    state = first.data_state()
    grown = module(Mixture({"web": 0.5, "code": 0.3, "books": 0.2}, on_change="new_epoch"),
                   data=sources(books=50))
    grown.load_state_dict(state)
    loader = grown.train_dataloader()
    batch = served(next(iter(loader)))
    assert {tag for tag, _ in batch} == {1, 2, 3} and loader.batch_sampler.epoch == 1
    summary = loader.batch_sampler.mixture.summary(loader.batch_sampler)
    assert summary["sources"]["web"]["rows"] == 21 + 5 and summary["sources"]["books"]["rows"] == 2
    assert summary["step"] == 4  # the run's steps go on: 3 before the change, and this one


def test_val_split_cuts_every_source():
    dm = module(val_split=0.1)
    dm.setup()
    assert dm.split_sizes["val"] == 7 + 3 and dm.split_sizes["train"] == 63 + 27
    val = [row for batch in dm.val_dataloader() for row in served(batch)]
    assert counts(val) == {1: 7, 2: 3}


def test_a_state_saved_with_another_val_split_is_refused_naming_it():
    dm = module(val_split=0.1)
    run(dm, 2)
    state = dm.data_state()
    with pytest.raises(ValueError, match=r"split of the mixture's sources \['code', 'web'\] differs .*val_split or "
                                         r"test_split changed.*Resume with the val_split and test_split of the saved"):
        module(val_split=0.2).load_state_dict(state)
    module(val_split=0.1).load_state_dict(state)  # the same splits resume


def test_a_state_saved_with_another_mixture_split_is_refused_but_a_new_source_joins():
    dm = module(val_split=2)
    run(dm, 2)
    state = dm.data_state()
    joined = module(Mixture({"web": 1, "code": 1, "books": 1}, on_change="new_epoch"), data=sources(books=20),
                    val_split=2)
    joined.load_state_dict(state)  # the splits of the sources both have are compared, by name


def test_a_new_mixture_goes_on_in_the_saved_epoch_at_any_number_of_workers():
    first = module()
    before = run(first, 3)
    state = pickle.loads(pickle.dumps(first.data_state()))
    mix = Mixture({"web": 0.4, "code": 0.2, "books": 0.4}, samples_per_epoch=100, on_change="continue")
    rests = []
    for workers in (0, 2):
        changed = module(mix, workers=workers, data=sources(books=50))
        changed.load_state_dict(state)
        loader = changed.train_dataloader()
        rests.append([served(batch) for batch in loader])  # the rest of epoch 0
        assert len(loader) == 3 + len(rests[-1])
    assert rests[0] == rests[1]
    epoch = [row for batch in before + rests[0] for row in batch]
    assert len(epoch) == len(set(epoch)) == 100  # no row of the epoch twice, and its 100 rows
    assert [[sum(tag == source for tag, _ in batch) for source in (1, 2, 3)] for batch in rests[0]] == [[4, 2, 4]] * 7
    sampler = loader.batch_sampler
    summary = sampler.mixture.summary(sampler)
    assert {name: source["rows"] for name, source in summary["sources"].items()} == {"web": 21 + 28, "code": 9 + 14,
                                                                                      "books": 28}


@pytest.mark.parametrize("batching", ["grouped", "token_budget", "packed"])
def test_every_batching_mode_goes_on_in_the_saved_epoch_with_the_same_batches_at_any_number_of_workers(batching):
    options = {"batching": batching, "batch_size": 10} if batching == "grouped" else {
        "batching": batching, "max_tokens": 40}
    first = module(**options)
    loader = first.train_dataloader()
    before = [{key: value.tolist() if torch.is_tensor(value) else value for key, value in batch.items()}
              for _, batch in zip(range(3), loader)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    served_before = mixture_state(first)["served"]
    mix = Mixture({"web": 0.4, "code": 0.2, "books": 0.4}, samples_per_epoch=100, on_change="continue")
    rests, states = [], []
    for workers in (0, 2):
        changed = module(mix, workers=workers, data=sources(books=50), **options)
        changed.load_state_dict(state)
        loader = changed.train_dataloader()
        batches = iter(loader)
        rest = [next(batches), next(batches)]  # the state is loaded as the pass starts
        steps = len(loader)
        states.append(mixture_state(changed))
        rest += list(batches)  # the rest of epoch 0
        assert steps == 3 + len(rest)  # the epoch's steps count those served before the change
        rests.append([{key: value.tolist() if torch.is_tensor(value) else value for key, value in batch.items()}
                      for batch in rest])
    assert rests[0] == rests[1] and states[0] == states[1]
    epoch = [row for batch in before + rests[0] for row in documents(batch)]
    assert len(epoch) == len(set(epoch)) == 100  # no row of the epoch twice, and its 100 rows
    after = [row for batch in rests[0][:2] for row in documents(batch)]
    served = states[0]["served"]  # counted on from the saved counts, by source name
    assert {name: rows for name, (rows, _) in served.items()} == {
        name: served_before.get(name, [0, 0])[0] + sum(tag == TAGS[name] for tag, _ in after) for name in TAGS}


def test_shuffle_false_with_a_mixture_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"shuffle=False with mix=: .*leave shuffle unset with mix="):
        module(shuffle=False)
    assert module(shuffle=True).train_config.shuffle


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: UniversalDataModule(sources(), task_spec=SPEC), TypeError, r"pass mix=\{name: weight\}"),
    (lambda: UniversalDataModule(Tagged(1, 5), task_spec=SPEC, mix={"web": 1}), TypeError,
     r"train_data should be \{name: data\}"),
    (lambda: module({"web": 1, "books": 1}), KeyError, r"without a weight: \['code'\], weights without a source: "
                                                        r"\['books'\]"),
    (lambda: module(Mixture({"web": 1, "code": 1}, schedule=[(3, {"web": 0, "code": 1})]), batching="packed",
                    max_tokens=40, batch_size=None), ValueError, "schedule changes weights at training steps"),
    (lambda: module(mix=1.5), TypeError, "mix should be a Mixture or a dict"),
    (lambda: module(data={"web": Tagged(1, 9), "code": datasets.Dataset.from_dict({"input_ids": [[2]] * 9})}),
     ValueError, r"train_data\['code'\] has \['input_ids'\] and train_data\['web'\] has \['input_ids', 'row_id'\]"),
])
def test_a_mixture_that_cannot_work_is_refused_at_construction(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(("step", "fix"), [(30, "put it at step 50$"), (130, "put it at step 100 or 150$")])
def test_a_grouped_schedule_must_change_at_the_start_of_a_sorted_run(step, fix):
    with pytest.raises(ValueError, match=fix):
        module(Mixture({"web": 1, "code": 1}, schedule=[(step, {"web": 0, "code": 1})]), batching="grouped")


def test_token_weights_follow_the_token_shares():
    web = Tagged(1, 200)  # rows of 2..6 tokens
    long = datasets.Dataset.from_dict({"input_ids": [[2] * 30] * 200, "row_id": list(range(200))})
    dm = UniversalDataModule({"web": web, "long": long}, task_spec=SPEC, batch_size=16, seed=1,
                             mix=Mixture({"web": 0.5, "long": 0.5}, by="tokens", samples_per_epoch=320))
    tokens = np.zeros(3)
    for batch in dm.train_dataloader():
        for tag in (1, 2):
            tokens[tag] += int((batch["input_ids"] == tag).sum())
    assert abs(tokens[1] / tokens[1:].sum() - 0.5) < 0.05


def test_a_sharded_source_mixes_reading_its_row_groups_in_turn(tmp_path):
    write_corpus(tmp_path / "corpus", files=2, rows_per_file=120, row_group_rows=40)  # docs 0..239
    other = datasets.Dataset.from_dict({"input_ids": [[7] * 4] * 80, "doc": list(range(1000, 1080))})

    def make(workers):
        shards = Shards(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"), shuffle_window=40)
        return UniversalDataModule({"shards": shards, "other": other}, task_spec=CORPUS_SPEC, batch_size=16, seed=3,
                                   mix={"shards": 0.75, "other": 0.25}, num_workers=workers)

    def docs_of(dm):
        return [batch["doc"].tolist() for batch in dm.train_dataloader()]

    first = make(0)
    batches = docs_of(first)
    assert all(sum(doc >= 1000 for doc in batch) == 4 for batch in batches)
    reads = first.report().numbers["shards"]["train 'shards'"]  # the mixture's sharded source, by name
    assert reads["rows"] == 240 and reads["process"]["fetched"] + reads["process"]["cache_hits"] >= 6
    served = [doc for batch in batches for doc in batch]
    assert sorted(served) == list(range(240)) + list(range(1000, 1080))
    groups = [len({doc // 40 for doc in batch if doc < 1000}) for batch in batches]
    assert max(groups) <= 2  # a batch's shard rows lie in one row group, or two where a window ends
    assert docs_of(make(2)) == batches


def kept(row):
    """A per-row transform that changes nothing: a mixture with a transform reads its sources as rows."""
    return row


def sharded_mixture(tmp_path, data, workers, path):
    """A module mixing ``data`` (sharded sources, by name) half and half, read as columns or (``path='rows'``, with a
    transform) as rows."""
    transform = {"train_transform": kept} if path == "rows" else {}
    dm = UniversalDataModule(data, task_spec=CORPUS_SPEC, batch_size=16, seed=3, num_workers=workers,
                             mix={name: 1 / len(data) for name in data}, **transform)
    dm.setup("fit")
    assert dm.datasets["train"].columnar() == (path == "columns")
    return dm


def shard_reads_of_an_epoch(dm):
    """``dm``'s shard counts before and after one epoch of its train loader, and the docs it served."""
    loader = dm.train_dataloader()
    dm.report()  # its first call reads the first batch in this process, after taking the counts
    before = dm.report().numbers["shards"]
    served = [int(doc) for batch in loader for doc in batch["doc"]]
    return before, dm.report().numbers["shards"], served


@pytest.mark.parametrize("path", ["columns", "rows"])
def test_loader_workers_send_each_sharded_source_s_reads_by_name(tmp_path, path):
    write_corpus(tmp_path / "web", files=2, rows_per_file=80, row_group_rows=40)  # 4 row groups
    write_corpus(tmp_path / "code", files=1, rows_per_file=160, row_group_rows=20, seed=1)  # 8 row groups

    def make(workers):
        cache = tmp_path / f"cache-{workers}"  # empty: each row group read is fetched once, by some process
        return sharded_mixture(tmp_path, {name: Shards(str(tmp_path / name), cache_dir=str(cache / name),
                                                       shuffle_window=40) for name in ("web", "code")}, workers, path)

    _, alone, _ = shard_reads_of_an_epoch(make(0))
    before, after, served = shard_reads_of_an_epoch(make(2))
    assert sorted(served) == sorted([*range(160), *range(160)])  # every row group of both corpora is read
    for name, groups in (("web", 4), ("code", 8)):
        reads, own = after[f"train {name!r}"], before[f"train {name!r}"]
        assert reads["process"] == own["process"]  # the parent read no batch
        assert alone[f"train {name!r}"]["process"]["fetched"] == groups
        assert reads["workers"]["fetched"] + own["process"]["fetched"] == groups
        assert reads["workers"]["cache_hits"] > 0 and reads["workers"]["bytes_fetched"] > 0


def test_sources_of_one_corpus_send_its_reads_once(tmp_path):
    from engine.sources.shards.source import ShardedSource

    write_corpus(tmp_path / "corpus", files=2, rows_per_file=80, row_group_rows=40)  # 4 row groups
    corpus = ShardedSource.from_shards(Shards(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache")))
    before, after, served = shard_reads_of_an_epoch(sharded_mixture(tmp_path, {"a": corpus, "b": corpus}, 2,
                                                                    "columns"))
    assert sorted(served) == sorted([*range(160), *range(160)])
    assert list(after) == ["train 'a', train 'b'"]  # one reader, listed once
    reads, own = after["train 'a', train 'b'"], before["train 'a', train 'b'"]
    assert reads["process"] == own["process"]
    assert reads["workers"]["fetched"] + own["process"]["fetched"] == 4


def test_a_row_that_fails_to_collate_is_named_by_its_source_and_row():
    data = {"web": Tagged(1, 20), "code": Tagged(99, 20)}  # code's token 99 is past the vocabulary of 64
    dm = module({"web": 0.5, "code": 0.5}, data=data, batch_size=4)
    with pytest.raises(ValueError, match=r"of the train data \(source, row\) failed at row \d+ of the train data's "
                                         r"source 'code' \(the batch's row \d\).*values in \[0, 64\)"):
        next(iter(dm.train_dataloader()))


def test_a_mixed_batch_read_as_columns_equals_the_rows_read_one_by_one():
    from engine.sources.mixed import MixedSource
    from engine.sources.wrappers import HFSource

    web = HFSource(datasets.Dataset.from_dict({"input_ids": [[1] * (1 + i % 6) for i in range(50)],
                                               "row_id": list(range(50))}))
    mixed = MixedSource({"web": web, "code": HFSource(datasets.Dataset.from_dict(
        {"input_ids": [list(range(i, i + 1 + i % 4)) for i in range(40)], "row_id": list(range(40))}))})
    columns = mixed.handing_columns()
    rng = np.random.default_rng(0)
    for _ in range(20):
        indices = rng.integers(0, len(mixed), int(rng.integers(1, 24))).tolist()
        as_columns = columns.__getitems__(indices)
        as_rows = mixed.__getitems__(indices)
        assert [{key: list(value) for key, value in row.items() if key == "input_ids"} for row in as_columns] == \
               [{key: list(value) for key, value in row.items() if key == "input_ids"} for row in as_rows]
        assert [row["row_id"] for row in as_columns] == [row["row_id"] for row in as_rows]
        assert as_columns.sources == as_rows.sources == [("web", "code")[i >= 50] for i in indices]


def test_a_mixed_batch_of_flat_buffers_of_two_dtypes_and_arrow_reads_as_columns_the_rows_and_their_sources():
    from engine.sources.mixed import MixedSource
    from engine.sources.wrappers import HFSource, TensorListSource

    small = TensorListSource([torch.arange(i, i + 1 + i % 5, dtype=torch.int32) for i in range(30)])
    large = TensorListSource([torch.arange(100 + i, 103 + i + i % 7) for i in range(20)]).view(np.arange(19, -1, -1))
    arrow = HFSource(datasets.Dataset.from_dict({"input_ids": [[7] * (1 + i % 3) for i in range(10)]}))
    mixed = MixedSource({"small": small, "large": large, "arrow": arrow})
    columns = mixed.handing_columns()
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, len(mixed), int(rng.integers(1, 40))).tolist() for _ in range(30)]
    for indices in batches + [[55], [31, 30], list(range(30, 50))]:
        as_columns, as_rows = columns.__getitems__(indices), mixed.__getitems__(indices)
        assert isinstance(as_columns, ColumnBatch)
        assert [row["input_ids"] for row in as_columns] == [list(np.asarray(row).tolist()) if not isinstance(
            row, dict) else list(row["input_ids"]) for row in as_rows]
        assert as_columns.sources == as_rows.sources
        assert as_columns.indices == as_rows.indices  # the user's rows (the view's 19 - i for "large")
    with pytest.raises(IndexError, match="row 60 is out of range for the mixed source of 60 rows"):
        columns.__getitems__([3, 60])


def test_a_mixed_batch_of_flat_buffers_of_one_dtype_reads_as_columns_the_rows_and_their_sources():
    from engine.sources.mixed import MixedSource
    from engine.sources.wrappers import TensorListSource

    web = TensorListSource([torch.arange(i, i + 1 + i % 5) for i in range(30)])
    code = TensorListSource([torch.arange(100 + i, 103 + i + i % 7) for i in range(20)]).view(np.arange(19, -1, -1))
    mixed = MixedSource({"web": web, "code": code})
    columns = mixed.handing_columns()
    in_worker = pickle.loads(pickle.dumps(columns))  # each worker gathers from its own copy of the sources
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, len(mixed), int(rng.integers(1, 40))).tolist() for _ in range(30)]
    for indices in batches + [[49], [31, 30], list(range(25, 50))]:
        as_columns, as_rows = columns.__getitems__(indices), mixed.__getitems__(indices)
        assert isinstance(as_columns, ColumnBatch)
        assert [row["input_ids"] for row in as_columns] == [row.tolist() for row in as_rows]
        assert as_columns.to_columns()["input_ids"].values.dtype == np.int64
        assert as_columns.sources == as_rows.sources == [("web", "code")[i >= 30] for i in indices]
        assert as_columns.indices == as_rows.indices  # the user's rows (the view's 19 - i for "code")
        again = in_worker.__getitems__(indices)
        assert [row["input_ids"] for row in again] == [row["input_ids"] for row in as_columns]
    for bad in (50, -1):
        with pytest.raises(IndexError, match=f"row {bad} is out of range for the mixed source of 50 rows"):
            columns.__getitems__([3, bad])


def test_a_module_with_a_mixture_is_rebuilt_from_its_lightning_checkpoint(tmp_path):
    from tests.distributed._lightning_elastic import Recorder
    from tests.engine.test_resume_lightning import trainer

    def mixture():
        return Mixture({"web": 0.6, "code": 0.3, "books": 0.1}, schedule=[(3, {"web": 1, "code": 1, "books": 1})],
                       exhaust={"books": "stop"})

    first = trainer(max_steps=2, enable_checkpointing=False)
    first.fit(Recorder(), datamodule=module(mixture(), data=sources(books=40)))
    first.save_checkpoint(tmp_path / "two.ckpt")
    rebuilt = UniversalDataModule.load_from_checkpoint(tmp_path / "two.ckpt", train_data=sources(books=40))
    assert rebuilt.mixture == mixture()
    resumed, full = Recorder(), Recorder()
    trainer(max_steps=5, enable_checkpointing=False).fit(resumed, datamodule=rebuilt, ckpt_path=tmp_path / "two.ckpt")
    trainer(max_steps=5, enable_checkpointing=False).fit(full, datamodule=module(mixture(), data=sources(books=40)))
    assert resumed.rows == full.rows[20:]


def test_lightning_goes_on_in_the_saved_epoch_with_a_new_mixture(tmp_path):
    from tests.distributed._lightning_elastic import Recorder
    from tests.engine.test_resume_lightning import trainer

    class Steps(Recorder):
        def __init__(self):
            super().__init__()
            self.steps = []

        def training_step(self, batch, batch_index):
            tags = batch["input_ids"][:, 0].tolist()
            self.steps.append((self.current_epoch, [tags.count(tag) for tag in (1, 2, 3)]))
            return super().training_step(batch, batch_index)

    first = trainer(max_steps=3, enable_checkpointing=False)
    first.fit(Steps(), datamodule=module())
    first.save_checkpoint(tmp_path / "three.ckpt")
    mix = Mixture({"web": 0.4, "code": 0.2, "books": 0.4}, samples_per_epoch=100, on_change="continue")
    resumed = Steps()
    trainer(max_steps=12, enable_checkpointing=False).fit(resumed, datamodule=module(mix, data=sources(books=50)),
                                                          ckpt_path=tmp_path / "three.ckpt")
    # the saved epoch's 7 steps left, then the next epoch (Lightning counted the epoch it stopped in at max_steps)
    assert [epoch for epoch, _ in resumed.steps] == [1] * 7 + [2] * 2
    assert [counts for _, counts in resumed.steps[:7]] == [[4, 2, 4]] * 7


class Broken(Tagged):
    """Tagged rows whose row 3 fails to read."""

    def __getitem__(self, index):
        if index == 3:
            raise OSError("row 3 is unreadable")
        return super().__getitem__(index)


def test_a_row_that_fails_to_read_is_left_out_and_named_by_its_source():
    dm = module({"web": 0.5, "code": 0.5}, data={"web": Tagged(1, 20), "code": Broken(2, 20)}, on_error="skip",
                batch_size=8)
    rows = [row for batch in dm.train_dataloader() for row in served(batch)]
    assert (2, 3) not in rows and len(rows) == 39
    assert [(record.split, record.index) for record in dm.skipped.records] == [("train 'code'", 3)]
    assert dm.data_state()["skipped_rows"] == 1  # counted in the train split, and so carried by a checkpoint


def random_bit(row, generator):
    """A per-row transform that records one random bit drawn from the row's own generator."""
    return {**row, "bit": int(torch.randint(2, (1,), generator=generator))}


def test_each_source_s_rows_have_their_own_transform_seeds():
    dm = module({"web": 0.5, "code": 0.5}, data={"web": Tagged(1, 40), "code": Tagged(2, 40)},
                train_transform=random_bit, batch_size=8)
    bits = {}
    for batch in dm.train_dataloader():
        for ids, row, bit in zip(batch["input_ids"], batch["row_id"], batch["bit"]):
            bits[(int(ids[0]), int(row))] = int(bit)
    assert [bits[(1, row)] for row in range(40)] != [bits[(2, row)] for row in range(40)]
    again = module({"web": 0.5, "code": 0.5}, data={"web": Tagged(1, 40), "code": Tagged(2, 40)},
                   train_transform=random_bit, batch_size=8, workers=2)
    assert {(int(ids[0]), int(row)): int(bit) for batch in again.train_dataloader()
            for ids, row, bit in zip(batch["input_ids"], batch["row_id"], batch["bit"])} == bits


def test_the_served_counts_leave_out_the_rows_on_error_skipped():
    def skipping():
        return module(Mixture({"web": 0.5, "code": 0.5}, by="tokens"),
                      data={"web": Tagged(1, 20), "code": Broken(2, 20)}, on_error="skip", batch_size=8)

    dm = skipping()
    rows = [row for batch in dm.train_dataloader() for row in served(batch)]
    code = [row for tag, row in rows if tag == 2]
    expected = [len(code), sum(2 + row % 5 for row in code)]
    assert 3 not in code
    assert dm.data_state()["train_loader"]["_index_sampler_state"]["mixture"]["served"]["code"] == expected
    numbers = dm.report().numbers["mixture"]["sources"]["code"]
    assert [numbers["rows"], numbers["tokens"]] == expected  # the row left out was counted as served
    resumed = skipping()
    resumed.load_state_dict(dm.data_state())
    assert resumed.report().numbers["mixture"]["sources"]["code"]["rows"] == expected[0]  # carried by a checkpoint


def test_errors_of_one_source_name_it():
    web = [torch.tensor([1, 1])] * 20
    empty = [torch.tensor([2, 2]), torch.zeros(0, dtype=torch.long), torch.tensor([2])]
    dm = module({"web": 1, "code": 1}, data={"web": web, "code": empty})
    with pytest.raises(ValueError, match=r"mixture source train_data\['code'\]: 'input_ids' should hold at least one "
                                         r"token in every row, but row 1"):
        dm.setup()
    with pytest.raises(ValueError, match=r"mixture source train_data\['code'\]: val_split=25 rows is out of range for "
                                         r"20 rows.*cut each source of a mixture on its own"):
        module({"web": 1, "code": 1}, data={"web": Tagged(1, 40), "code": Tagged(2, 20)}, val_split=25)


def test_sources_named_like_columns_are_sources_when_mix_weighs_those_names():
    ids = [torch.full((3,), 1) for _ in range(20)]
    labels = [torch.full((5,), 2) for _ in range(20)]
    dm = UniversalDataModule({"input_ids": ids, "labels": labels}, task_spec=SPEC, mix={"input_ids": 1, "labels": 1},
                             batch_size=4)
    batches = list(dm.train_dataloader())
    assert len(batches) == 10 and all(sorted(batch["input_ids"][:, 0].tolist()) == [1, 1, 2, 2] for batch in batches)


@pytest.mark.parametrize("kind", ["dataset", "tensors"])
def test_a_raw_text_source_mixes_with_a_pre_tokenized_one(tokenizer, kind):
    words = ["alpha", "beta", "gamma", "delta"]
    raw = datasets.Dataset.from_dict({"text": [" ".join(words[: 1 + i % 4]) for i in range(40)]})
    rows = [[5, 6, 7, 8][: 2 + i % 3] for i in range(40)]
    ids = datasets.Dataset.from_dict({"input_ids": rows}) if kind == "dataset" else [torch.tensor(r) for r in rows]
    dm = UniversalDataModule({"raw": raw, "ids": ids}, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer,
                             mix={"raw": 1, "ids": 1}, batch_size=8)
    alone = UniversalDataModule(raw, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=40, shuffle=False)
    texts = {tuple(row[mask.bool()].tolist()) for batch in alone.train_dataloader()
             for row, mask in zip(batch["input_ids"], batch["attention_mask"])}
    served = [tuple(row[mask.bool()].tolist()) for batch in dm.train_dataloader()
              for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert len(served) == 80 and sum(row in texts for row in served) == 40  # the raw rows tokenized, masks alike


def test_resuming_plans_the_same_epochs_whatever_the_epoch_number(monkeypatch):
    import engine.sampling.mixtures.order as order_module

    walk = order_module.walk

    def resumed_walks(epochs):
        """The epochs planned to resume after ``epochs`` whole epochs and a batch, and the resumed summary."""
        dm = module({"web": 0.7, "code": 0.3}, data=sources(web=40, code=30))
        loader = dm.train_dataloader()
        for _ in range(epochs):
            list(loader)
        batches = iter(loader)
        next(batches)
        state, expected = dm.data_state(), next(batches)
        walked = []
        monkeypatch.setattr(order_module, "walk", lambda *args: walked.append(args[1]) or walk(*args))
        resumed = module({"web": 0.7, "code": 0.3}, data=sources(web=40, code=30))
        resumed.load_state_dict(state)
        again = next(iter(resumed.train_dataloader()))
        monkeypatch.setattr(order_module, "walk", walk)
        assert served(again) == served(expected)
        sampler = resumed.train_dataloader().batch_sampler
        return walked, sampler.mixture.summary(sampler)

    early, _ = resumed_walks(1)
    late, summary = resumed_walks(12)
    assert (early, late) == ([0, 1], [0, 12])  # epoch 0 sizes the sampler; was all 13 epochs up to 12
    assert abs(summary["sources"]["code"]["target_share"] - 0.3) < 0.01  # the summary still counts every epoch


class BadValue(Tagged):
    """Tagged rows whose row 3 reads but fails to collate (a 2-D ``input_ids``), as a corrupt image fails where
    it is decoded."""

    def __getitem__(self, index):
        row = super().__getitem__(index)
        return {**row, "input_ids": torch.zeros(2, 2, dtype=torch.long)} if index == 3 else row


def test_a_row_that_fails_to_collate_is_left_out_named_by_its_source_and_not_counted_as_served():
    def skipping():
        return module({"web": 0.5, "code": 0.5}, data={"web": Tagged(1, 20), "code": BadValue(2, 20)},
                      on_error="skip", batch_size=8)

    dm = skipping()
    rows = [row for batch in dm.train_dataloader() for row in served(batch)]
    assert (2, 3) not in rows and len(rows) == 39 and len(set(rows)) == 39
    assert [(record.split, record.index) for record in dm.skipped.records] == [("train 'code'", 3)]
    code = [row for tag, row in rows if tag == 2]
    assert dm.data_state()["train_loader"]["_index_sampler_state"]["mixture"]["served"]["code"][0] == len(code)
    with pytest.raises(TypeError, match=r"row 3 of the train data's source 'code'"):  # on_error='raise' names it
        list(module({"web": 0.5, "code": 0.5}, data={"web": Tagged(1, 20), "code": BadValue(2, 20)},
                    batch_size=8).train_dataloader())
