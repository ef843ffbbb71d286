"""The training core: one config, the data, the models and losses, the step and the Trainer, checkpoints, recovery
and image quality. Imports only `measuring` below it (and the shared `errors`, `quick`)."""
