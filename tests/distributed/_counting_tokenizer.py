"""A tokenizer that writes every text it tokenizes in a batch to a file, so a test can count tokenizations across
processes (datasets' num_proc workers, DDP ranks)."""

import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from demo.sample_data import SPECIAL_TOKENS, build_tokenizer


class CountingTokenizer(PreTrainedTokenizerFast):
    def __init__(self, *args, counter_path: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.counter_path = counter_path

    def __call__(self, text=None, *args, **kwargs):
        if isinstance(text, list):  # a batch from Dataset.map (single probes such as tokenizer("a") are not counted)
            with open(self.counter_path, "a", encoding="utf-8") as counter:
                counter.writelines(json.dumps(item) + "\n" for item in text)
        return super().__call__(text, *args, **kwargs)


def counting_tokenizer(counter_path: Path) -> CountingTokenizer:
    """The demo tokenizer, counting into ``counter_path``."""
    return CountingTokenizer(tokenizer_object=build_tokenizer().backend_tokenizer, counter_path=str(counter_path),
                             **SPECIAL_TOKENS)


def counted(counter_path: Path) -> list[str]:
    """The texts tokenized so far, one entry per tokenization."""
    if not counter_path.exists():
        return []
    return [json.loads(line) for line in counter_path.read_text(encoding="utf-8").splitlines()]
