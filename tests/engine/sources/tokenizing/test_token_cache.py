"""Raw text tokenized once per machine: the cached result equals today's single-process tokenization (also with
num_proc=2), a second module and setup after prepare_data load it instead of tokenizing again."""

import shutil
from pathlib import Path

import datasets
import pytest

from demo.sample_data import build_tokenizer
from engine import UniversalDataModule
from engine.sources.tokenizing.preprocess import tokenize_dataset
from engine.sources.tokenizing.token_cache import TokenCache, default_cache_dir, is_complete
from task_spec import TaskSpec
from tests.distributed._counting_tokenizer import counted, counting_tokenizer

SPEC = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 12})
TEXTS = [f"the owl {i} sleeps in the old tree by the lake " * (1 + i % 3) for i in range(50)]


def raw(texts=TEXTS):
    return datasets.Dataset.from_dict({"text": texts, "topic": [i % 2 for i in range(len(texts))]})


@pytest.mark.parametrize("num_proc", [None, 2])
def test_cached_tokenization_equals_todays_single_process_map(tmp_path, num_proc):
    tokenizer = build_tokenizer()
    today = tokenize_dataset(raw(), SPEC, tokenizer)  # the map setup ran before: truncating in the tokenizer
    dm = UniversalDataModule(raw(), task_spec=SPEC, tokenizer=tokenizer, cache_dir=tmp_path, num_proc=num_proc)
    dm.setup()
    assert dm.datasets["train"].dataset.to_list() == today.to_list()
    assert dm.truncation["long_rows"] > 0  # what the tokenizer cuts is now counted
    assert dm.truncation["lost_tokens"] == sum(max(len(ids) - 12, 0) for ids in tokenizer(TEXTS)["input_ids"])
    names = [path.name for path in tmp_path.iterdir()]
    assert len(names) == 1 and names[0].startswith("tokenized-") and "." not in names[0]  # no scratch or temporary


def test_a_second_module_loads_the_cache_instead_of_tokenizing(tmp_path):
    counter = tmp_path / "counter.txt"
    first = UniversalDataModule(raw(), task_spec=SPEC, tokenizer=counting_tokenizer(counter), cache_dir=tmp_path / "c")
    first.setup()
    assert sorted(counted(counter)) == sorted(TEXTS)
    second = UniversalDataModule(raw(), task_spec=SPEC, tokenizer=counting_tokenizer(counter),
                                 cache_dir=tmp_path / "c", long_rows="split")  # the policy is applied after the cache
    second.setup()
    assert sorted(counted(counter)) == sorted(TEXTS)  # not tokenized again
    assert len(list((tmp_path / "c").iterdir())) == 1
    assert second.long_rows_report["train"]["out_rows"] > first.long_rows_report["train"]["out_rows"] == 50
    other = UniversalDataModule(raw(TEXTS[:10]), task_spec=SPEC, tokenizer=counting_tokenizer(counter),
                                cache_dir=tmp_path / "c")
    other.setup()  # other data: its own cache file
    assert len(counted(counter)) == 60 and len(list((tmp_path / "c").iterdir())) == 2


def test_prepare_data_tokenizes_and_setup_only_loads(tmp_path):
    counter = tmp_path / "counter.txt"
    dm = UniversalDataModule(raw(), task_spec=SPEC, tokenizer=counting_tokenizer(counter), cache_dir=tmp_path / "c",
                             val_split=0.2)
    dm.prepare_data()
    assert sorted(counted(counter)) == sorted(TEXTS) and dm.datasets == {}  # setup has not run
    dm.setup()
    assert len(counted(counter)) == 50 and dm.split_sizes["val"] == 10
    assert dm.datasets["train"].dataset.cache_files  # memory-mapped from the cache, not held in this process


def test_an_unfinished_cache_folder_is_rebuilt(tmp_path):
    tokenizer = build_tokenizer()
    cache = TokenCache(str(tmp_path))
    path = cache.path_for(raw(), tokenizer, ("text",))
    path.mkdir(parents=True)  # a writer that died before finishing (the real writer renames a whole folder)
    (path / "data-00000-of-00001.arrow").write_bytes(b"partial")
    assert not is_complete(path)
    loaded = cache.load_or_build(path, lambda scratch: raw())
    assert is_complete(path) and loaded.to_list() == raw().to_list()


def test_the_default_cache_sits_beside_the_datasets_cache():
    assert default_cache_dir() == Path(datasets.config.HF_DATASETS_CACHE) / "universal_datamodule" / "tokenized"
    assert TokenCache.resolve(None, None).directory == default_cache_dir()


def test_a_lightning_fit_tokenizes_in_prepare_data_once(tmp_path):
    import lightning
    import torch

    class TinyLM(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(build_tokenizer()), 4)

        def training_step(self, batch, batch_index):
            return self.embed(batch["input_ids"]).float().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    counter = tmp_path / "counter.txt"
    dm = UniversalDataModule(raw(), task_spec=SPEC, tokenizer=counting_tokenizer(counter), cache_dir=tmp_path / "c",
                             batch_size=10, long_rows="split")
    tokenized_before_setup, setup = [], dm.setup

    def counting_setup(stage=None):
        tokenized_before_setup.append(len(counted(counter)))
        setup(stage)

    dm.setup = counting_setup
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLM(), datamodule=dm)
    assert tokenized_before_setup[0] == len(TEXTS)  # Lightning's prepare_data did it, before setup
    assert trainer.global_step == 2 and sorted(counted(counter)) == sorted(TEXTS)


def arrow_files(*folders):
    return {path: path.stat().st_size for folder in folders if folder.exists() for path in folder.rglob("*.arrow")}


@pytest.mark.parametrize("num_proc", [None, 2])
def test_the_tokenized_corpus_is_kept_once_in_the_cache_folder(tmp_path, num_proc):
    raw().save_to_disk(str(tmp_path / "source"))
    source = datasets.load_from_disk(str(tmp_path / "source"))  # has cache files: map would write beside them
    hf_cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = arrow_files(tmp_path, hf_cache)
    spec = SPEC.replace(additional_config={"max_seq_len": 512})  # no row is cut: no map over the cached rows
    dm = UniversalDataModule(source, task_spec=spec, tokenizer=build_tokenizer(), cache_dir=tmp_path / "c",
                             num_proc=num_proc)
    dm.setup()
    written = {path: size for path, size in arrow_files(tmp_path, hf_cache).items() if path not in before}
    [(kept, size)] = written.items()  # one file, in the cache folder: no map cache-*.arrow beside the source's files
    assert kept.parent.parent == tmp_path / "c" and kept.name == "data-00000-of-00001.arrow"
    assert [Path(f["filename"]) for f in dm.datasets["train"].dataset.cache_files] == [kept]
    assert size < 2 * sum(len(ids) for ids in dm.datasets["train"].dataset["input_ids"]) * 8 + 65536  # one copy
    del dm
    shutil.rmtree(tmp_path / "c")
    assert arrow_files(tmp_path, hf_cache) == before  # deleting the cache folder leaves no tokenized copy elsewhere
