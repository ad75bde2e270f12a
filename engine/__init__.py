"""The data-loading engine: configs, loader factory, samplers and the UniversalDataModule."""

from collators import CollatorRegistry
from engine.config import DataLoaderConfig
from engine.factory import DataLoaderFactory
from engine.module import UniversalDataModule
from engine.protocol import DataModuleProtocol
from engine.rng import derive_seed
from engine.samplers import SeededBatchSampler
from engine.splits import SplitPlan, plan_splits

__all__ = [
    "CollatorRegistry",
    "DataLoaderConfig",
    "DataLoaderFactory",
    "DataModuleProtocol",
    "SeededBatchSampler",
    "SplitPlan",
    "UniversalDataModule",
    "derive_seed",
    "plan_splits",
]
