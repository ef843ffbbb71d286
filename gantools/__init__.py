"""gantools: make GAN training fast, and show why. See README.md for the tour."""
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, preset
from .data import (DeviceLoader, HostLoader, ImageFolderDataset, ImageTensorDataset, data_root, dataset_from_config,
                   load_glyphs, make_dataset, make_loader, render_glyphs)
from .errors import (CheckpointError, ConfigError, DataError, DoctorError, GantoolsError, NonFiniteLossError,
                     OutOfMemory, QualityError)
from .hardware import Timer, machine_info, resolve_device
from .models import Discriminator, Generator, build_dcgan, dcgan_init
from .train import History, Trainer
from .tuning import TuneResult, tune

__version__ = "0.1.0"
__all__ = [
    "CheckpointError", "ConfigError", "DataError", "DeviceLoader", "Discriminator", "DoctorError", "GantoolsError",
    "Generator",
    "History", "HostLoader", "ImageFolderDataset", "ImageTensorDataset", "NonFiniteLossError", "OutOfMemory",
    "QualityError", "Timer", "TrainConfig", "Trainer", "build_dcgan", "data_root", "dataset_from_config",
    "dcgan_init", "load_checkpoint", "load_glyphs", "machine_info", "make_dataset", "make_loader", "preset",
    "render_glyphs", "resolve_device", "save_checkpoint", "tune", "TuneResult",
]
