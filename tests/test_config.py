from dataclasses import fields

import pytest
import torch

from gantools import ConfigError, TrainConfig, preset
from gantools.core.config import Knob, cli_flags, knobs, speed_knobs


def test_defaults_and_presets_are_valid():
    TrainConfig().validate()
    ref = preset("reference").validate()
    assert ref.loss == "bce-sigmoid" and ref.num_workers == 2 and ref.transform == "per-sample"
    assert ref.sync_every_step and not ref.freeze_d and ref.precision == "fp32"


BAD = [
    (dict(precision="fp16", device="cpu"), "fp16"),
    (dict(precision="fp64"), "precision"),
    (dict(grad_accum_steps=0), "grad_accum_steps"),
    (dict(batch_size=10, grad_accum_steps=3), "not divisible"),
    (dict(batch_size=0), "batch_size"),
    (dict(dataset="imagenet"), "dataset"),
    (dict(dataset="folder"), "data_path"),
    (dict(dataset="folder", data_path="/no/such/folder"), "no such folder"),
    (dict(data_path="/tmp"), "only used with dataset='folder'"),
    (dict(dataset="glyphs-color", channels=1), "channels=3"),
    (dict(image_size=48), "image_size"),
    (dict(channels=2), "channels"),
    (dict(steps=0), "steps"),
    (dict(loss="wasserstein"), "loss"),
    (dict(loss="bce-sigmoid", precision="bf16"), "unsafe under autocast"),
    (dict(optimizer="sgd"), "optimizer"),
    (dict(optimizer_impl="turbo"), "optimizer_impl"),
    (dict(lr_g=0.0), "lr_g"),
    (dict(lr_d=-1e-3), "lr_d"),
    (dict(betas=(0.5, 1.0)), "betas"),
    (dict(betas=(0.5,)), "betas"),
    (dict(betas=(0.5, "x")), "betas=(0.5, 'x') (tuple): must be two numbers"),
    (dict(pin_memory="yes"), "pin_memory='yes' (str): must be True or False or None"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(compile="fast"), "compile"),
    (dict(compile="reduce-overhead", device="cpu"), "CUDA graphs"),
    (dict(num_workers=-1), "num_workers"),
    (dict(persistent_workers=True), "persistent_workers"),
    (dict(prefetch_factor=2), "prefetch_factor"),
    (dict(num_workers=2, prefetch_factor=0), "prefetch_factor"),
    (dict(pin_memory=True, device="cpu"), "pin_memory"),
    (dict(loader="gpu"), "loader"),
    (dict(loader="device", transform="per-sample"), "transform='on-device'"),
    (dict(loader="device", num_workers=2), "DataLoader knobs"),
    (dict(transform="random"), "transform"),
    (dict(grad_accum_steps=2, drop_last=False), "drop_last"),
    (dict(log_interval=0), "log_interval"),
    (dict(sample_interval=-1), "sample_interval"),
    (dict(checkpoint_interval=-5), "checkpoint_interval"),
    (dict(nz=0), "nz"),
    (dict(ngf=0), "ngf"),
    (dict(device="tpu"), "device"),
    (dict(out_dir=""), "out_dir"),
    (dict(batch_size="64"), "batch_size='64' (str): must be a whole number"),
    (dict(lr_g="fast"), "lr_g"),
    (dict(channels_last="yes"), "channels_last"),
    (dict(tf32=1), "tf32"),
]
if not torch.cuda.is_available():
    BAD.append((dict(device="cuda"), "no CUDA GPU"))


@pytest.mark.parametrize("changes, message", BAD, ids=[str(c) for c, _ in BAD])
def test_each_bad_value_gets_its_own_clear_error(changes, message):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**changes).validate()
    assert message in str(e.value)
    assert str(e.value).count("\n  - ") == 1, f"exactly one problem expected, got: {e.value}"


def test_all_problems_are_listed_in_one_error():
    with pytest.raises(ConfigError) as e:
        TrainConfig(steps=0, loss="x", nz=0).validate()
    assert str(e.value).count("\n  - ") == 3


def test_replace_and_presets_refuse_unknown_names():
    with pytest.raises(ConfigError, match="unknown config field"):
        TrainConfig().replace(batchsize=3)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("fastest")


def test_round_trip_through_a_dict():
    cfg = TrainConfig(betas=(0.0, 0.9), precision="bf16", tf32=False)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_every_field_is_described_once_by_its_knob():
    described = knobs()
    assert list(described) == [f.name for f in fields(TrainConfig)]
    for _name, knob in described.items():
        assert isinstance(knob, Knob) and knob.kind in (bool, int, float, str) and knob.help
    assert described["betas"].pair and described["pin_memory"].optional and described["pin_memory"].kind is bool
    assert described["precision"].choices == ("fp32", "fp16", "bf16")
    # the speed knobs change how fast a run trains, never what it learns: what a tuner may search
    assert {"precision", "channels_last", "compile", "loader", "num_workers", "pin_memory", "optimizer_impl",
            "cudnn_benchmark", "tf32", "freeze_d"} <= set(speed_knobs())
    assert not {"lr_g", "batch_size", "seed", "dataset", "loss", "betas", "steps"} & set(speed_knobs())


def test_cli_flags_rebuild_the_config_through_the_parser():
    from gantools.cli import build_parser

    cfg = TrainConfig(betas=(0.0, 0.9), precision="bf16", tf32=False, drop_last=False, channels_last=True,
                      pin_memory=False, prefetch_factor=3, num_workers=2, lr_d=1e-3, out_dir="runs/x")
    flags = cli_flags(cfg)
    assert flags[:2] == ["--num-workers", "2"] and "--no-drop-last" in flags and "--no-tf32" in flags
    parsed = vars(build_parser().parse_args(["train", *flags]))
    values = {k: v for k, v in parsed.items() if k in knobs()}
    assert TrainConfig().replace(**values) == cfg and cli_flags(TrainConfig()) == []


def test_a_pair_given_as_a_list_is_stored_as_a_tuple():
    assert TrainConfig(betas=[0.1, 0.2]).betas == (0.1, 0.2)
    assert TrainConfig().replace(betas=[0.3, 0.4]).betas == (0.3, 0.4)
