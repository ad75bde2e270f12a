"""The data-loading engine: configs, loader factory, samplers, the UniversalDataModule and its utilities."""

from collators import CollatorRegistry
from engine.core.rng import derive_seed
from engine.core.skipped_rows import SkippedRow, SkipReport
from engine.core.stateful import Stateful
from engine.datamodule.protocol import DataModuleProtocol
from engine.datamodule.universal import UniversalDataModule
from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory
from engine.multi.config import EpochLengthPolicy, MultiDataLoaderConfig, SamplingStrategy
from engine.multi.loader import MultiDataLoader
from engine.multi.module import MultiDataModule, build_multi_loader
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
from engine.tools.device import DeviceNormalize, normalize_on_device
from engine.tools.mixture_callback import MixtureCallback
from engine.tools.monitor import DataMonitor, DataMonitorCallback
from engine.tools.report import DataReport
from engine.tools.skipped import SkippedRowsCallback
from engine.tools.split_files import create_loader, load_split_indices
from engine.tools.steps import Batch, get_epoch_length, get_train_dataloader_steps, get_val_dataloader_steps
from engine.tools.transfer import move_to_device
from engine.tools.tuning import recommend_num_workers
from engine.tools.validation import BatchValidationError, ValidationReport, validate_first_batch

__all__ = [
    "Batch",
    "BatchValidationError",
    "CollatorRegistry",
    "DataLoaderConfig",
    "DataLoaderFactory",
    "DataModuleProtocol",
    "DataMonitor",
    "DataMonitorCallback",
    "DataReport",
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
