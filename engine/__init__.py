"""The data-loading engine: configs, loader factory, samplers, the UniversalDataModule and its utilities.

Each public name is imported when first read (PEP 562): ``import engine`` costs next to nothing, and a plain
training loop that uses ``DataModule``, the factory, the samplers, ``Shards``, ``Mixture`` and ``build_multi_loader``
never imports Lightning. Only ``UniversalDataModule``, ``MultiDataModule`` and the Lightning callbacks import it, when
first read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collators import CollatorRegistry
    from engine.core.rng import derive_seed
    from engine.core.skipped_rows import SkippedRow, SkipReport
    from engine.core.stateful import Stateful
    from engine.datamodule.module import DataModule
    from engine.datamodule.protocol import DataModuleProtocol
    from engine.datamodule.universal import UniversalDataModule
    from engine.loading.config import DataLoaderConfig
    from engine.loading.factory import DataLoaderFactory
    from engine.multi.config import EpochLengthPolicy, MultiDataLoaderConfig, SamplingStrategy
    from engine.multi.loader import MultiDataLoader, build_multi_loader
    from engine.multi.module import MultiDataModule
    from engine.sampling.epochs import set_epoch
    from engine.sampling.eval import ShardedEvalBatchSampler
    from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
    from engine.sampling.mixtures.mixture import Mixture
    from engine.sampling.packed import PackedBatchSampler
    from engine.sampling.seeded import SeededBatchSampler
    from engine.sources.protocol import Source, UserSource
    from engine.sources.shards.listing import Shards
    from engine.sources.splits import SplitPlan, plan_splits
    from engine.sources.tokenizing.ray_tokenize import tokenize_on_ray
    from engine.tools.device import DeviceDecode, DeviceNormalize, normalize_on_device
    from engine.tools.mixture_callback import MixtureCallback
    from engine.tools.monitor import DataMonitor
    from engine.tools.monitor_callback import DataMonitorCallback
    from engine.tools.report import DataReport
    from engine.tools.skipped import SkippedRowsCallback
    from engine.tools.split_files import create_loader, load_split_indices
    from engine.tools.steps import Batch, get_epoch_length, get_train_dataloader_steps, get_val_dataloader_steps
    from engine.tools.transfer import move_to_device
    from engine.tools.tuning import recommend_num_workers
    from engine.tools.validation import BatchValidationError, ValidationReport, validate_first_batch

_LAZY = {
    "CollatorRegistry": "collators",
    "derive_seed": "engine.core.rng",
    "SkippedRow": "engine.core.skipped_rows",
    "SkipReport": "engine.core.skipped_rows",
    "Stateful": "engine.core.stateful",
    "DataModule": "engine.datamodule.module",
    "DataModuleProtocol": "engine.datamodule.protocol",
    "UniversalDataModule": "engine.datamodule.universal",
    "DataLoaderConfig": "engine.loading.config",
    "DataLoaderFactory": "engine.loading.factory",
    "EpochLengthPolicy": "engine.multi.config",
    "MultiDataLoaderConfig": "engine.multi.config",
    "SamplingStrategy": "engine.multi.config",
    "MultiDataLoader": "engine.multi.loader",
    "MultiDataModule": "engine.multi.module",
    "build_multi_loader": "engine.multi.loader",
    "set_epoch": "engine.sampling.epochs",
    "ShardedEvalBatchSampler": "engine.sampling.eval",
    "LengthGroupedBatchSampler": "engine.sampling.length",
    "TokenBudgetBatchSampler": "engine.sampling.length",
    "Mixture": "engine.sampling.mixtures.mixture",
    "PackedBatchSampler": "engine.sampling.packed",
    "SeededBatchSampler": "engine.sampling.seeded",
    "Source": "engine.sources.protocol",
    "UserSource": "engine.sources.protocol",
    "Shards": "engine.sources.shards.listing",
    "SplitPlan": "engine.sources.splits",
    "plan_splits": "engine.sources.splits",
    "tokenize_on_ray": "engine.sources.tokenizing.ray_tokenize",
    "DeviceDecode": "engine.tools.device",
    "DeviceNormalize": "engine.tools.device",
    "normalize_on_device": "engine.tools.device",
    "MixtureCallback": "engine.tools.mixture_callback",
    "DataMonitor": "engine.tools.monitor",
    "DataMonitorCallback": "engine.tools.monitor_callback",
    "DataReport": "engine.tools.report",
    "SkippedRowsCallback": "engine.tools.skipped",
    "create_loader": "engine.tools.split_files",
    "load_split_indices": "engine.tools.split_files",
    "Batch": "engine.tools.steps",
    "get_epoch_length": "engine.tools.steps",
    "get_train_dataloader_steps": "engine.tools.steps",
    "get_val_dataloader_steps": "engine.tools.steps",
    "move_to_device": "engine.tools.transfer",
    "recommend_num_workers": "engine.tools.tuning",
    "BatchValidationError": "engine.tools.validation",
    "ValidationReport": "engine.tools.validation",
    "validate_first_batch": "engine.tools.validation",
}
"""Each public name and the module that defines it, imported on first use."""

__all__ = [
    "Batch",
    "BatchValidationError",
    "CollatorRegistry",
    "DataLoaderConfig",
    "DataLoaderFactory",
    "DataModule",
    "DataModuleProtocol",
    "DataMonitor",
    "DataMonitorCallback",
    "DataReport",
    "DeviceDecode",
    "DeviceNormalize",
    "EpochLengthPolicy",
    "LengthGroupedBatchSampler",
    "Mixture",
    "MixtureCallback",
    "MultiDataLoader",
    "MultiDataLoaderConfig",
    "MultiDataModule",
    "PackedBatchSampler",
    "SamplingStrategy",
    "SeededBatchSampler",
    "ShardedEvalBatchSampler",
    "Shards",
    "SkipReport",
    "SkippedRow",
    "SkippedRowsCallback",
    "Source",
    "SplitPlan",
    "Stateful",
    "TokenBudgetBatchSampler",
    "UniversalDataModule",
    "UserSource",
    "ValidationReport",
    "build_multi_loader",
    "create_loader",
    "derive_seed",
    "get_epoch_length",
    "get_train_dataloader_steps",
    "get_val_dataloader_steps",
    "load_split_indices",
    "move_to_device",
    "normalize_on_device",
    "plan_splits",
    "recommend_num_workers",
    "set_epoch",
    "tokenize_on_ray",
    "validate_first_batch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
