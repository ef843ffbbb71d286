"""gantools: make GAN training fast, and show why. See README.md for the tour."""
from .core.checkpoint import load_checkpoint, save_checkpoint
from .core.config import TrainConfig, preset
from .core.data import (CachedFolder, ImageFolderDataset, ImageTensorDataset, data_root, dataset_from_config,
                        load_glyphs, make_dataset, render_glyphs)
from .core.history import History
from .core.loaders import DeviceLoader, HostLoader, MappedLoader, make_loader
from .core.models import Discriminator, Generator, build_dcgan, dcgan_init
from .core.r3gan import R3GANDiscriminator, R3GANGenerator, build_r3gan
from .core.trainer import Trainer
from .errors import (CheckpointError, ConfigError, DataError, DoctorError, GantoolsError, NonFiniteLossError,
                     OutOfMemory, QualityError)
from .measuring.hardware import Timer, autocast_precision, machine_info, resolve_device
from .tuning import TuneResult, tune

__version__ = "0.1.0"
__all__ = [
    "autocast_precision", "build_dcgan", "build_r3gan", "CachedFolder", "CheckpointError", "ConfigError", "data_root",
    "DataError", "dataset_from_config", "dcgan_init", "DeviceLoader", "Discriminator", "DoctorError", "GantoolsError",
    "Generator", "History", "HostLoader", "ImageFolderDataset", "ImageTensorDataset", "load_checkpoint",
    "load_glyphs", "machine_info", "make_dataset", "make_loader", "MappedLoader", "NonFiniteLossError", "OutOfMemory",
    "preset", "QualityError", "R3GANDiscriminator", "R3GANGenerator", "render_glyphs", "resolve_device",
    "save_checkpoint", "Timer", "TrainConfig", "Trainer", "tune", "TuneResult",
]
