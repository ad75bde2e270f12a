"""One contract, every source: each kind of data the engine takes (tests/conformance/sources.py) is held to the same
properties, each either true or refused at construction with a clear error. The cells are chosen in
tests/conformance/matrix.py; docs/conformance.md says how, and lists the refusals."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine import UniversalDataModule
from tests.conformance.matrix import (
    BATCHING,
    FULL,
    LOADERS,
    SPAWN_CELLS,
    Bug,
    Refusal,
    cell_id,
    cells,
    expectation,
    sources,
)
from tests.conformance.sources import (
    BAD_ROW,
    KINDS,
    ROWS,
    Maker,
    Rows,
    SQLiteRows,
    batch_rows,
    decoded_image,
    served_rows,
    text_row,
    token_row,
    tokenizer,
    write_sqlite,
)
from tests.engine.sources.test_bad_rows import no_hang

EPOCHS = 2


@pytest.fixture
def maker(request, tmp_path):
    """``maker(kind, rows)``: a :class:`Maker` writing into this test's folder (and its S3 bucket, when asked)."""
    def make(kind: str, rows: str) -> Maker:
        bucket = request.getfixturevalue("s3_bucket") if kind in ("shards_s3", "shards_tar_s3") else None
        return Maker(kind, Rows(rows), tmp_path, bucket)
    return make


def module(made: dict[str, Any], rows: Rows, *, batching: str = "plain", loader: str = "workers0",
           **options: Any) -> UniversalDataModule:
    own = rows.module_options() if "collate_fn" not in made else {}  # an image-text kind's collator keeps uint8
    settings = {"task_spec": rows.spec, "batch_size": 4, "seed": 7, **own, **BATCHING[batching],
                **LOADERS[loader], **options}
    return UniversalDataModule(**made, **settings)


def epochs(dm: UniversalDataModule, count: int = EPOCHS) -> list[list[dict[str, Any]]]:
    """The batches of ``count`` whole passes of the training loader, per epoch."""
    loader = dm.train_dataloader()
    with no_hang(180):
        return [list(loader) for _ in range(count)]


def take(dm: UniversalDataModule, steps: int) -> list[dict[str, Any]]:
    """``steps`` training batches, passing epochs as a plain loop does."""
    seen, loader = [], dm.train_dataloader()
    with no_hang(180):
        while len(seen) < steps:
            for batch in loader:
                seen.append(batch)
                if len(seen) == steps:
                    break
    return seen


def assert_same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected)
    for number, (one, other) in enumerate(zip(got, expected)):
        assert sorted(one) == sorted(other), f"batch {number}: keys differ"
        for key in one:
            if torch.is_tensor(one[key]):
                assert torch.equal(one[key], other[key]), f"batch {number}: {key!r} differs"
            else:
                assert one[key] == other[key], f"batch {number}: {key!r} differs"


def expect(kind: str, rows: str, batching: str, loader: str = "workers0") -> None:
    """Fail here, in a cell the covering should never have chosen, rather than later with a confusing error."""
    assert expectation(kind, rows, batching, loader) is None, "the matrix chose a refused cell"


_REFERENCE: dict[tuple[str, str, str, str], list[list[dict[str, Any]]]] = {}


def reference(maker, kind: str, rows: str, batching: str, loader: str = "workers0") -> list[list[dict[str, Any]]]:
    """The uninterrupted run at ``loader``, per epoch (kept for the session: the same rows give the same batches
    whatever folder they were written to); each epoch checked to serve every known row exactly once."""
    key = (kind, rows, batching, loader)
    if key not in _REFERENCE:
        made = maker(kind, rows)
        run = epochs(module(made(), made.rows, batching=batching, loader=loader))
        known = made.rows.known()
        for number, batches in enumerate(run):
            assert sorted(served_rows(batches, made.rows, known)) == list(range(ROWS)), f"epoch {number}"
        if not KINDS[kind].stream:  # a new order every epoch; a stream is read in its own order
            assert served_rows(run[0], made.rows, known) != served_rows(run[1], made.rows, known)
        _REFERENCE[key] = run
    return _REFERENCE[key]


# ----------------------------------------------------------------------------------------------------------------
# same batches at any loader, and exact resume mid-epoch


def _loader_cells() -> list[Any]:
    axes = {"kind": list(KINDS), "rows": ["tokens", "text", "images"], "batching": list(BATCHING),
            "loader": ["threads2", "fork2", "spawn2"], "stop": [3, 13]}

    def valid(cell: dict[str, Any]) -> bool:
        if cell["rows"] not in KINDS[cell["kind"]].rows:
            return False
        if cell["loader"] == "spawn2" and not FULL:
            return False
        return expectation(cell["kind"], cell["rows"], cell["batching"], cell["loader"]) is None

    spawned = [{"kind": kind, "rows": rows, "batching": batching, "loader": "spawn2", "stop": 3}
               for kind, rows, batching in SPAWN_CELLS]
    chosen = cells(axes, valid)
    if not FULL:
        chosen += spawned
    return [pytest.param(cell, id=cell_id(cell)) for cell in chosen]


@pytest.mark.parametrize("cell", _loader_cells())
def test_resumed_with_another_loader_serves_the_uninterrupted_batches(maker, cell):
    """Stop after ``stop`` batches at ``num_workers=0`` (mid-epoch 0, or mid-epoch 1), save, load the state into a
    fresh module that loads with ``loader``: its batches are the uninterrupted run's, tensor for tensor. So the
    batches are the same at any loader, and the resume is exact. A stream resumes on its own loader only
    (its position is per worker: see the refusals), and its batches depend on the loader's workers."""
    kind, rows, batching, loader, stop = cell["kind"], cell["rows"], cell["batching"], cell["loader"], cell["stop"]
    expect(kind, rows, batching, loader)
    # a stream's batches depend on its workers (datasets deals its shards to them; documented): its reference is
    # the uninterrupted run at the same loader
    expected = [batch for epoch in reference(maker, kind, rows, batching, loader if KINDS[kind].stream else "workers0")
                for batch in epoch]
    made = maker(kind, rows)
    first = module(made(), made.rows, batching=batching, loader=loader if KINDS[kind].stream else "workers0")
    assert_same_batches(take(first, stop), expected[:stop])
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(made(), made.rows, batching=batching, loader=loader)
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, len(expected) - stop), expected[stop:])


def test_a_stream_refuses_to_resume_on_another_number_of_workers(maker):
    made = maker("stream", "tokens")
    first = module(made(), made.rows)
    take(first, 3)
    resumed = module(made(), made.rows, loader="fork2")
    with pytest.raises(ValueError, match=r"num_workers was 0 when saved and is 2 now \(a stream's position"):
        resumed.load_state_dict(first.state_dict())


# ----------------------------------------------------------------------------------------------------------------
# elastic resume: 2 ranks -> 1 and 1 -> 2, ranks simulated by a trainer that names them


def on_rank(dm: UniversalDataModule, rank: int, world_size: int) -> UniversalDataModule:
    """``dm`` as rank ``rank`` of ``world_size`` sees itself under a Lightning trainer (which keeps our samplers)."""
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world_size,
                                 _accelerator_connector=SimpleNamespace(use_distributed_sampler=False))
    return dm


def ranked(made: Maker, batching: str, world_size: int, rank: int) -> UniversalDataModule:
    """Rank ``rank`` of ``world_size`` with the same global batch: 8 rows, or a budget of 80 tokens."""
    per_rank = {"batch_size": 8 // world_size} if batching in ("plain", "grouped") else {"max_tokens": 80 // world_size}
    return on_rank(module(made(), made.rows, batching=batching, **per_rank), rank, world_size)


def _elastic_cells() -> list[Any]:
    axes = {"kind": list(KINDS), "rows": ["tokens", "text", "images"], "batching": list(BATCHING),
            "ranks": ["2to1", "1to2"]}

    def valid(cell: dict[str, Any]) -> bool:
        return (cell["rows"] in KINDS[cell["kind"]].rows and not KINDS[cell["kind"]].stream
                and expectation(cell["kind"], cell["rows"], cell["batching"]) is None)

    return [pytest.param(cell, id=cell_id(cell)) for cell in cells(axes, valid)]


@pytest.mark.parametrize("cell", _elastic_cells())
def test_elastic_resume_serves_every_row_of_the_epoch_exactly_once(maker, cell):
    """Two steps on ``before`` ranks, then the rest of the epoch on ``after`` ranks from the saved state (rank 0's,
    as a checkpoint holds it): no row served before the save is served again, and every other row is served after
    it. A row served twice after it is the padding that gives every rank the same number of steps
    (``uneven="pad"``, as in any epoch on several ranks): it may only be in a rank's last batch."""
    kind, rows, batching = cell["kind"], cell["rows"], cell["batching"]
    before, after = (2, 1) if cell["ranks"] == "2to1" else (1, 2)
    made = maker(kind, rows)
    known = made.rows.known()
    saving = [ranked(made, batching, before, rank) for rank in range(before)]
    served = []
    for dm in saving:
        served += served_rows(take(dm, 2), made.rows, known)
    state = pickle.loads(pickle.dumps(saving[0].state_dict()))
    rest, last = [], []
    for rank in range(after):
        resumed = ranked(made, batching, after, rank)
        resumed.load_state_dict(state)
        with no_hang(120):
            batches = list(resumed.train_dataloader())
        rest += served_rows(batches, made.rows, known)
        last += served_rows(batches[-1:], made.rows, known)
    assert len(served) == len(set(served)) and not set(served) & set(rest)
    assert sorted(set(served) | set(rest)) == list(range(ROWS))
    twice = Counter(rest) - Counter(set(rest))
    assert not twice - Counter(last), f"rows served twice after the resume, not as the last steps' padding: {twice}"


def test_a_stream_refuses_another_number_of_ranks(maker):
    made = maker("stream", "tokens")
    first = on_rank(module(made(), made.rows), 0, 1)
    take(first, 2)
    resumed = on_rank(module(made(), made.rows, batch_size=2), 0, 2)
    with pytest.raises(ValueError, match=r"world_size was 1 when saved and is 2 now"):
        resumed.load_state_dict(first.state_dict())


# ----------------------------------------------------------------------------------------------------------------
# refusals, and known bugs: each refused at construction (or xfail, naming what happens instead)


def _refusal_cells() -> list[Any]:
    found = []
    for kind, rows in sources():
        for batching in BATCHING:
            for loader in ("workers0", "threads2"):
                expected = expectation(kind, rows, batching, loader)
                if expected is None or (loader == "threads2" and expected == expectation(kind, rows, batching)):
                    continue
                marks = [pytest.mark.xfail(strict=True, reason=expected.reason)] if isinstance(expected, Bug) else []
                found.append(pytest.param(kind, rows, batching, loader, expected, marks=marks,
                                          id=f"{kind}-{rows}-{batching}-{loader}"))
    return found


@pytest.mark.parametrize(("kind", "rows", "batching", "loader", "expected"), _refusal_cells())
def test_a_refused_combination_is_refused_at_construction(maker, kind, rows, batching, loader, expected):
    made = maker(kind, rows)
    if isinstance(expected, Refusal):
        with pytest.raises(expected.error, match=expected.match):
            module(made(), made.rows, batching=batching, loader=loader)
    else:  # a bug: the contract is a refusal at construction, with a clear error
        with pytest.raises((ValueError, TypeError)):
            module(made(), made.rows, batching=batching, loader=loader)


def test_a_mixture_of_raw_text_in_an_hf_dataset_and_a_torch_dataset_is_refused_at_construction():
    import datasets

    from tests.conformance.sources import TorchRows

    rows = Rows("text")
    records = rows.records()
    data = {"web": datasets.Dataset.from_list(records[:20]), "code": TorchRows(records[20:])}
    with pytest.raises(ValueError, match=r"a mixture's sources should reach the collator alike.*train_data\['code'\] "
                                         r"would be tokenized batch by batch.*datasets.Dataset.from_list"):
        UniversalDataModule(data, mix={"web": 1, "code": 1}, task_spec=rows.spec, **rows.module_options())


# ----------------------------------------------------------------------------------------------------------------
# per source, the cheap properties: the full product of sources and properties


SOURCES = [pytest.param(kind, rows, id=f"{kind}-{rows}") for kind, rows in sources()]


def raising_on_bad_row(known):
    """A transform that fails on the row :data:`BAD_ROW` (told by its content), as a row that cannot be read."""
    return RaiseOn(known)


class RaiseOn:
    def __init__(self, known: dict[tuple, int]) -> None:
        self.known = known

    def __call__(self, row: dict[str, Any], *, generator: torch.Generator) -> dict[str, Any]:
        if "input_ids" in row and self.known.get(tuple(torch.as_tensor(row["input_ids"]).tolist())) == BAD_ROW:
            raise OSError("row 13 is unreadable")
        return row


@pytest.mark.parametrize(("kind", "rows"), SOURCES)
def test_on_error_skip_leaves_out_the_bad_row_and_counts_it(maker, kind, rows):
    made = maker(kind, rows)
    if KINDS[kind].stream:
        with pytest.raises(ValueError, match=r"on_error='skip' leaves out rows by their index, which a stream"):
            module(made(), made.rows, on_error="skip")
        return
    known = made.rows.known()
    if KINDS[kind].own_bad_row:
        dm = module(made(bad=True), made.rows, on_error="skip")
    else:
        dm = module(made(), made.rows, on_error="skip", train_transform=RaiseOn(known))
    first, second = epochs(dm)
    every_other = [doc for doc in range(ROWS) if doc != BAD_ROW]
    assert sorted(served_rows(first, made.rows, known)) == every_other
    assert sorted(served_rows(second, made.rows, known)) == every_other
    assert dm.skipped.count == 2 and dm.skipped.counts == {"train": 2}  # once per epoch


ADDED_WORDS = ("owl", "moon")


class AppendToken:
    """Appends one token (a word, to raw text; a blue level, to an image) drawn from the row's generator: new every
    epoch, a function of (seed, epoch, index)."""

    def __call__(self, row: dict[str, Any], *, generator: torch.Generator) -> dict[str, Any]:
        if "image" in row:  # an encoded image (an image-text source's) is decoded first
            image = decoded_image(row["image"]).clone()
            image[2] = int(torch.randint(8, 250, (), generator=generator))
            return {**row, "image": image}
        if "input_ids" not in row:  # raw text the collator tokenizes (a torch Dataset's, a user source's)
            return {**row, "text": f"{row['text']} {ADDED_WORDS[int(torch.randint(2, (), generator=generator))]}"}
        ids = torch.as_tensor(row["input_ids"])
        row = {**row, "input_ids": torch.cat([ids, torch.randint(400, 700, (1,), generator=generator)])}
        if "attention_mask" in row:  # rows the module tokenized carry their mask
            row["attention_mask"] = torch.cat([torch.as_tensor(row["attention_mask"]), torch.ones(1, dtype=torch.long)])
        return row


def transformed_rows(batches: list[dict[str, Any]], rows: Rows, known: dict[tuple, int]) -> list[tuple[int, Any]]:
    """``(doc, what the transform added)`` for each row served, checking the rest of the row is the known row."""
    found = []
    for batch in batches:
        contents = batch_rows(batch, rows)
        for position, content in enumerate(contents):
            if rows.kind == "images":
                found.append((known[content[:2]], content[2]))
            elif content[:-1] in known:
                found.append((known[content[:-1]], content[-1]))
            else:  # raw text with a word added before tokenizing: the batch's doc column names the row
                doc = int(batch["doc"][position])
                added = [word for word in ADDED_WORDS
                         if tuple(tokenizer()(f"{text_row(doc)} {word}")["input_ids"]) == content]
                assert len(added) == 1, f"row {doc} is not the known row with one word added: {content}"
                found.append((doc, added[0]))
    return found


@pytest.mark.parametrize(("kind", "rows"), SOURCES)
def test_a_train_transform_is_applied_to_every_row_seeded_per_epoch(maker, kind, rows):
    made = maker(kind, rows)
    if KINDS[kind].stream:
        with pytest.raises(ValueError, match=r"train_transform is seeded by each row's dataset index, which a stream"):
            module(made(), made.rows, train_transform=AppendToken())
        return
    known = made.rows.known()
    first, second = epochs(module(made(), made.rows, train_transform=AppendToken()))
    added = []
    for batches in (first, second):
        found = transformed_rows(batches, made.rows, known)
        assert sorted(doc for doc, _ in found) == list(range(ROWS))
        added.append(dict(found))
    assert added[0] != added[1]  # drawn anew each epoch
    again = epochs(module(made(), made.rows, train_transform=AppendToken(), loader="threads2"), 1)[0]
    assert_same_batches(again, first)  # a function of (seed, epoch, index), in background threads too


@pytest.mark.parametrize(("kind", "rows"), SOURCES)
def test_val_split_cuts_disjoint_splits_that_hold_every_row(maker, kind, rows):
    made = maker(kind, rows)
    if KINDS[kind].stream:
        with pytest.raises(ValueError, match=r"val_split/test_split cannot cut rows out of a stream"):
            module(made(), made.rows, val_split=0.25)
        return
    known = made.rows.known()
    dm = module(made(), made.rows, val_split=0.25)
    train = served_rows(epochs(dm, 1)[0], made.rows, known)
    with no_hang(120):
        val = served_rows(list(dm.val_dataloader()), made.rows, known)
    assert len(val) == 10 and len(train) == 30 and sorted(train + val) == list(range(ROWS))
    assert dm.split_sizes["train"] == 30 and dm.split_sizes["val"] == 10


@pytest.mark.parametrize(("kind", "rows"), SOURCES)
def test_the_report_counts_the_rows_served(maker, kind, rows):
    """``dm.report()``'s train rows and tokens are those one epoch serves; a stream's report claims no count."""
    made = maker(kind, rows)
    known = made.rows.known()
    dm = module(made(), made.rows)
    served = served_rows(epochs(dm, 1)[0], made.rows, known)
    assert sorted(served) == list(range(ROWS))
    numbers = dm.report().numbers
    if KINDS[kind].stream:  # its length is unknown until read
        assert numbers["split_sizes"] == {"train": None} and "train" not in numbers["lengths"]
        return
    assert numbers["split_sizes"] == {"train": len(served)}
    if rows == "text" and kind in ("torch", "user_sqlite"):  # tokenized per batch: no lengths to count up front
        assert "train" not in numbers["lengths"] and numbers["skipped"]["train"].startswith("not measured")
    elif rows != "images":
        contents = {doc: content for content, doc in known.items()}
        assert numbers["lengths"]["train"]["rows"] == len(served)
        assert numbers["lengths"]["train"]["total"] == sum(len(contents[doc]) for doc in served)


@pytest.mark.parametrize(("kind", "rows"), SOURCES)
def test_resume_on_the_same_data_is_accepted_and_on_a_changed_row_refused(maker, kind, rows):
    made = maker(kind, rows)
    first = module(made(), made.rows)
    take(first, 3)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    module(made(), made.rows).load_state_dict(state)  # the same rows, written anew: accepted
    changed = module(made(changed=True), made.rows)
    with pytest.raises(ValueError, match=r"data_fingerprint was .* when saved|changed since it was saved"):
        changed.load_state_dict(state)


# ----------------------------------------------------------------------------------------------------------------
# a user's source: its own fingerprint() and lengths(key) are what the engine uses


class CountedSQLiteRows(SQLiteRows):
    """:class:`SQLiteRows` that counts, in this process, the rows read and the calls of its optional methods."""

    def __init__(self, path: Any, *, declares_lengths: bool = True) -> None:
        super().__init__(path)
        self.declares_lengths, self.rows_read, self.calls = declares_lengths, 0, Counter()

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        self.rows_read += len(indices)
        return super().__getitems__(indices)

    def fingerprint(self) -> str:
        self.calls["fingerprint"] += 1
        return super().fingerprint()

    def lengths(self, key: str) -> Any:
        self.calls["lengths"] += 1
        return super().lengths(key) if self.declares_lengths else None


@pytest.mark.parametrize("batching", ["grouped", "token_budget", "packed"])
def test_a_user_source_s_lengths_plan_the_epoch_without_reading_a_row(tmp_path, batching):
    """With ``lengths(key)`` the length-aware samplers read no row to plan the epoch; without it (None) they read
    every row once to measure it. The batches are the same: the declared lengths are the rows' own."""
    path = write_sqlite(tmp_path / "rows.sqlite", Rows("tokens").records())
    served = {}
    for declares in (True, False):
        source = CountedSQLiteRows(path, declares_lengths=declares)
        dm = module({"train_data": source}, Rows("tokens"), batching=batching)
        dm.setup()
        before = source.rows_read
        dm.train_dataloader()  # builds the sampler, which plans the epoch
        assert source.calls["lengths"] >= 1
        assert source.rows_read - before == (0 if declares else ROWS)
        served[declares] = epochs(dm)
    assert_same_batches(served[True][0] + served[True][1], served[False][0] + served[False][1])


def test_a_user_source_s_fingerprint_decides_whether_a_state_resumes(tmp_path):
    import sqlite3

    path = write_sqlite(tmp_path / "rows.sqlite", Rows("tokens").records())
    first = module({"train_data": CountedSQLiteRows(path)}, Rows("tokens"))
    take(first, 3)
    state = first.state_dict()
    same = CountedSQLiteRows(path)
    module({"train_data": same}, Rows("tokens")).load_state_dict(state)
    assert same.calls["fingerprint"] >= 1
    with sqlite3.connect(path) as db:  # one row changed in place, same length: only the content tells
        db.execute("UPDATE rows SET input_ids = ? WHERE doc = 1", (json.dumps(token_row(1, changed=True)),))
    db.close()
    with pytest.raises(ValueError, match=r"data_fingerprint was .* when saved"):
        module({"train_data": CountedSQLiteRows(path)}, Rows("tokens")).load_state_dict(state)
