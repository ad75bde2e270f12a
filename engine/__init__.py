"""The data-loading engine: configs, loader factory, samplers, the UniversalDataModule and its utilities."""

from collators import CollatorRegistry
from engine.batching import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.config import DataLoaderConfig
from engine.device import DeviceNormalize, normalize_on_device
from engine.epochs import set_epoch
from engine.factory import DataLoaderFactory
from engine.module import UniversalDataModule
from engine.monitor import DataMonitor, DataMonitorCallback
from engine.multi import MultiDataLoader, build_multi_loader
from engine.multi_config import EpochLengthPolicy, MultiDataLoaderConfig, SamplingStrategy
from engine.multi_module import MultiDataModule
from engine.protocol import DataModuleProtocol
from engine.rng import derive_seed
from engine.samplers import SeededBatchSampler, ShardedEvalBatchSampler
from engine.split_files import create_loader, load_split_indices
from engine.splits import SplitPlan, plan_splits
from engine.steps import Batch, get_epoch_length, get_train_dataloader_steps, get_val_dataloader_steps
from engine.transfer import move_to_device
from engine.tuning import recommend_num_workers
from engine.validation import BatchValidationError, ValidationReport, validate_first_batch

__all__ = [
    "Batch",
    "BatchValidationError",
    "CollatorRegistry",
    "DataLoaderConfig",
    "DataLoaderFactory",
    "DataModuleProtocol",
    "DataMonitor",
    "DataMonitorCallback",
    "DeviceNormalize",
    "EpochLengthPolicy",
    "LengthGroupedBatchSampler",
    "MultiDataLoader",
    "MultiDataLoaderConfig",
    "MultiDataModule",
    "SamplingStrategy",
    "SeededBatchSampler",
    "ShardedEvalBatchSampler",
    "SplitPlan",
    "TokenBudgetBatchSampler",
    "UniversalDataModule",
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
    "validate_first_batch",
]
