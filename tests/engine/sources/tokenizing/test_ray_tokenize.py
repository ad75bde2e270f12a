"""tokenize_on_ray: the one-machine tokenize step run on Ray Data, written as Parquet shards.

One local Ray instance serves the module. The shards must hold, row for row, what ``tokenize_dataset(...,
truncate=False)`` gives, and a second run must write the same files."""

from __future__ import annotations

import json
import re
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Shards
from engine.sources.adapt import as_source
from engine.sources.tokenizing.preprocess import TokenizeBatch, tokenize_dataset
from engine.sources.tokenizing.ray_tokenize import _ArrowTokenize, tokenize_on_ray
from task_spec import TaskSpec

ray = pytest.importorskip("ray")

WORDS = ["the", "fox", "ran", "to", "river", "héllo", "wörld", "日本語", "café", "naïve", "🙂", "baker", "hill"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def s3():
    """A local S3 server (moto) with the bucket ``corpus``: ``(storage_options, fsspec filesystem)``."""
    server_module = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("s3fs")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="corpus")
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    yield options, fsspec.filesystem("s3", **options)
    server.stop()


def texts(n: int, seed: int) -> list[str]:
    """``n`` rows of text, most short, every 17th long (a few hundred words), some with accents, CJK and emoji."""
    rows = []
    for i in range(n):
        length = 300 + i % 50 if i % 17 == 0 else 1 + (i * seed) % 12
        rows.append(" ".join(WORDS[(i + k * seed) % len(WORDS)] for k in range(length)))
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """240 rows of text with an id and a label, in 3 Parquet files named in corpus order."""
    folder = tmp_path_factory.mktemp("corpus")
    rows = texts(240, seed=5)
    for part in range(3):
        chunk = range(part * 80, (part + 1) * 80)
        pq.write_table(pa.table({"row_id": list(chunk), "text": [rows[i] for i in chunk],
                                 "label": [i % 3 for i in chunk]}), folder / f"part-{part}.parquet")
    return folder, rows


def read_shards(paths: list[str]) -> pa.Table:
    return pa.concat_tables([pq.read_table(path) for path in paths])


def test_shards_hold_the_one_machine_tokens_row_for_row_and_a_second_run_writes_the_same_files(
        local_ray, corpus, tokenizer, tmp_path, s3):
    folder, rows = corpus
    spec = TaskSpec.lm_tiny()
    first = tokenize_on_ray(folder, tmp_path / "first", task_spec=spec, tokenizer=tokenizer, rows_per_file=50,
                            row_group_rows=20)
    # The second run reads and writes object storage (S3 through fsspec and storage_options).
    options, storage = s3
    for part in range(3):
        storage.put(str(folder / f"part-{part}.parquet"), f"corpus/text/part-{part}.parquet")
    second = tokenize_on_ray("s3://corpus/text/", "s3://corpus/tokens", task_spec=spec, tokenizer=tokenizer,
                             storage_options=options, rows_per_file=50, row_group_rows=20)

    names = [path.rsplit("/", 1)[1] for path in first]
    assert names == sorted(names) and all(re.fullmatch(r"part-\d{5}-\d{4}\.parquet", name) for name in names)
    assert [pq.read_metadata(path).num_rows for path in first] == [50, 50, 50, 50, 40]
    assert {pq.read_metadata(path).row_group(0).num_rows for path in first} == {20}
    schemas = {pq.read_schema(path).remove_metadata() for path in first}
    assert len(schemas) == 1
    assert schemas.pop() == pa.schema([("row_id", pa.int64()), ("label", pa.int64()),
                                       ("input_ids", pa.list_(pa.int32())), ("attention_mask", pa.list_(pa.int8()))])

    table = read_shards(first)
    reference = tokenize_dataset(datasets.Dataset.from_dict({"row_id": list(range(240)), "text": rows,
                                                             "label": [i % 3 for i in range(240)]}),
                                 spec, tokenizer, truncate=False)
    assert table.column("row_id").to_pylist() == list(range(240))
    assert table.column("label").to_pylist() == reference["label"]
    assert table.column("input_ids").to_pylist() == reference["input_ids"]
    assert table.column("attention_mask").to_pylist() == reference["attention_mask"]
    assert max(len(ids) for ids in reference["input_ids"]) > spec.max_seq_len  # long rows stay whole
    # the engine streams the shards as they are: the same rows, in the same order, through Shards
    source = as_source(Shards(str(tmp_path / "first"), cache_dir=str(tmp_path / "cache")))
    assert [row["input_ids"] for row in source.__getitems__(list(range(240)))] == reference["input_ids"]

    assert second == [f"s3://corpus/tokens/{name}" for name in names]
    storage.invalidate_cache()
    for a, b in zip(first, second, strict=True):
        assert pq.read_table(a).equals(pq.read_table(storage.open(b)))


def test_seq2seq_from_json_lines_matches_the_one_machine_path(local_ray, tokenizer, tmp_path):
    spec = TaskSpec.seq2seq_tiny()
    sources, targets = texts(120, seed=3), texts(120, seed=7)
    files = [tmp_path / "b.jsonl", tmp_path / "a.jsonl"]  # a list is read in its order, not in name order
    for file_path, rows in zip(files, (range(0, 70), range(70, 120)), strict=True):
        with open(file_path, "w", encoding="utf-8") as file:
            for i in rows:
                file.write(json.dumps({"source": sources[i], "target": targets[i]}, ensure_ascii=False) + "\n")

    paths = tokenize_on_ray(files, tmp_path / "out", task_spec=spec, tokenizer=tokenizer)

    table = read_shards(paths)
    reference = tokenize_dataset(datasets.Dataset.from_dict({"source": sources, "target": targets}), spec,
                                 tokenizer, truncate=False)
    assert table.column_names == ["input_ids", "attention_mask", "labels"]
    assert table.schema.field("labels").type == pa.list_(pa.int32())
    assert table.column("input_ids").to_pylist() == reference["input_ids"]
    assert table.column("labels").to_pylist() == reference["labels"]
    assert max(len(ids) for ids in reference["labels"]) == spec.additional_config["max_target_len"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rows_per_file": 0}, "rows_per_file should be None or an int >= 1, but got 0"),
    ({"row_group_rows": 0}, "row_group_rows should be an int >= 1, but got 0"),
    ({"concurrency": 1.5}, "concurrency should be None or an int >= 1, but got 1.5"),
    ({"tokenizer": None}, "tokenizer should be a transformers tokenizer"),
    ({"task_spec": TaskSpec.vision_tiny()}, "tokenizes raw text, but the task 'vision_tiny' has modality 'vision'"),
])
def test_bad_options_are_refused_before_ray_runs(corpus, tokenizer, tmp_path, kwargs, message):
    folder, _ = corpus
    arguments = {"task_spec": TaskSpec.lm_tiny(), "tokenizer": tokenizer, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tokenize_on_ray(folder, tmp_path / "out", **arguments)


def test_bad_inputs_are_refused_with_the_fix(local_ray, corpus, tokenizer, tmp_path):
    folder, _ = corpus
    spec = TaskSpec.lm_tiny()
    with pytest.raises(ValueError, match="does not exist; give a file, a folder or a glob"):
        tokenize_on_ray(tmp_path / "missing.parquet", tmp_path / "out", task_spec=spec, tokenizer=tokenizer)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"unknown format \(\['.txt'\]\)"):
        tokenize_on_ray(tmp_path / "notes.txt", tmp_path / "out", task_spec=spec, tokenizer=tokenizer)
    (tmp_path / "rows.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"input mixes formats \['.csv', '.parquet'\]"):
        tokenize_on_ray([tmp_path / "rows.csv", folder / "part-0.parquet"], tmp_path / "out", task_spec=spec,
                        tokenizer=tokenizer)
    renamed = TaskSpec.lm_tiny().replace(preprocessing_config={"text_field": "body"})
    with pytest.raises(ValueError, match=r"no text column 'body' .*available columns: \['row_id', 'text', 'label'\]"
                                         r"; rename the column or set preprocessing_config"):
        tokenize_on_ray(folder, tmp_path / "out", task_spec=renamed, tokenizer=tokenizer)
    numbers = TaskSpec.lm_tiny().replace(preprocessing_config={"text_field": "label"})
    with pytest.raises(ValueError, match="text column 'label' should hold strings, but its type is int64"):
        tokenize_on_ray(folder, tmp_path / "out", task_spec=numbers, tokenizer=tokenizer)
    (tmp_path / "taken").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "taken" / "old.parquet")
    with pytest.raises(ValueError, match="already holds 1 Parquet files .* give a new or empty folder"):
        tokenize_on_ray(folder, tmp_path / "taken", task_spec=spec, tokenizer=tokenizer)


def test_null_text_is_refused_naming_the_column_and_the_fix(tokenizer):
    step = TokenizeBatch(tokenizer, "text", None, "labels", None, None)
    table = pa.table({"text": ["a fox", None, "a hill"], "row_id": [0, 1, 2]})
    with pytest.raises(ValueError, match="'text' should be a string in every row, but 1 rows of a batch hold null; "
                                         "the tokenizer needs text in each row: filter those rows out or fill them"):
        _ArrowTokenize(step)(table)


def test_without_ray_the_error_names_the_extra_to_install(corpus, tokenizer, tmp_path, monkeypatch):
    folder, _ = corpus
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'universal-datamodule\[ray\]'"):
        tokenize_on_ray(folder, tmp_path / "out", task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer)



def test_a_row_without_text_names_its_file_and_row_and_leaves_no_partial_output(local_ray, tokenizer, tmp_path):
    folder = tmp_path / "holes"
    folder.mkdir()
    rows = texts(240, seed=3)
    for part in range(3):
        chunk = [rows[i] for i in range(part * 80, (part + 1) * 80)]
        if part == 2:
            chunk[37] = None
        pq.write_table(pa.table({"text": pa.array(chunk, pa.string())}), folder / f"part-{part}.parquet")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"wrote nothing to '.*out': row 37 of '.*part-2.parquet' holds no text in "
                                         r"'text' \(null\); filter the rows without text out"):
        tokenize_on_ray(folder, out, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, rows_per_file=40)
    assert not list(out.rglob("*.parquet")) if out.exists() else True
