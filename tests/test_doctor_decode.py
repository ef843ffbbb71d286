"""decode-per-item (issue 51, item 4): a dataset that opens and decodes an image file per item is recognised (a
torchvision ImageFolder, or a Dataset of your own whose __getitem__ calls Image.open), the finding shows the lines
that decode once into a tensor file in the script's own names, and --try serves the items from memory only where that
cannot change them (a torchvision folder with deterministic transforms). The data wait that makes the loop
data-bound is injected, never measured, so no verdict here depends on the machine's timing."""
import dataclasses
from pathlib import Path

import pytest
import torch
import torchvision.datasets as dset
import torchvision.transforms as transforms
from PIL import Image
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gantools import doctor
from gantools.doctor.findings import rules
from gantools.doctor.fixes import catalogue as fixes
from gantools.doctor.fixes.pipeline import DECODE_ONCE, DecodedOnce
from gantools.doctor.watching.pipeline import decoding

from test_doctor_rules import FIRES, decoded

SCRIPT = Path(__file__).parent / "scripts" / "faces_folder.py"


def tutorial_transforms(*random):
    return transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32), *random, transforms.ToTensor(),
                               transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class OwnFolder(Dataset):
    """A Dataset of one's own: PIL in __getitem__."""

    def __init__(self, files, transform):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(Image.open(self.files[i]).convert("RGB")), 0


def test_a_decoding_dataset_is_recognised_and_one_in_memory_is_not(pngs):
    folder = decoding(dset.ImageFolder(pngs, transform=tutorial_transforms()))
    assert folder["keep"] == 2 and folder["size"] == 32 and folder["random"] == [] and folder["run_time"] is None
    flipped = decoding(dset.ImageFolder(pngs, transform=tutorial_transforms(transforms.RandomHorizontalFlip())))
    assert flipped["random"] == ["RandomHorizontalFlip"] and "RandomHorizontalFlip draws" in flipped["run_time"]
    own = decoding(OwnFolder(sorted(pngs.rglob("*.png")), tutorial_transforms()))
    assert "Image.open" in own["how"] and "your own code" in own["run_time"]
    assert decoding(TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4))) is None


def test_a_loader_over_tensors_gets_no_finding_and_the_decode_takes_the_per_sample_finding_s_place():
    r, facts = FIRES["decode-per-item"]
    assert "decode-per-item" in [f.kind for f in doctor.findings(r, facts)]
    assert "per-sample-transforms" not in [f.kind for f in doctor.findings(r, facts)]  # one finding per wait
    in_memory = dataclasses.replace(r, settings={**r.settings, "dataloaders": [
        {**r.settings["dataloaders"][0], "per_image_work": None, "decode": None, "dataset": "TensorDataset"}]})
    assert rules.decode_per_item(in_memory, facts) is None


def test_random_augmentation_is_shown_by_hand_with_its_reason_and_kept_on_the_device():
    r, facts = FIRES["decode-per-item"]
    why = "RandomHorizontalFlip draws new augmentation for each image every epoch"
    flip = dataclasses.replace(r, settings={**r.settings, "dataloaders": [
        {**r.settings["dataloaders"][0], "decode": decoded("RandomHorizontalFlip", run_time=why)}]})
    change = rules.decode_per_item(flip, facts).change
    assert change.startswith(f"# by hand: --try cannot apply it while your script runs ({why})")
    assert "full.transforms[:2], T.PILToTensor()" in change  # Resize and CenterCrop decoded once, not the flip
    assert ".flip(3)" in change and "torch.rand(len(real), 1, 1, 1" in change
    first = dataclasses.replace(r, settings={**r.settings, "dataloaders": [  # a crop of the full image: not once
        {**r.settings["dataloaders"][0], "decode": decoded(steps=["RandomResizedCrop", "ToTensor"], keep=0,
                                                           random=["RandomResizedCrop"])}]})
    assert "cannot keep your RandomResizedCrop" in rules.decode_per_item(first, facts).change


def test_try_serves_a_deterministic_folder_from_memory_and_leaves_random_augmentation_alone(pngs):
    ctx = fixes.Context("cpu", True, 2, None, None, None, decode=("ImageFolder", None))
    plain = dset.ImageFolder(pngs, transform=tutorial_transforms())
    expected = next(iter(DataLoader(plain, batch_size=16)))
    with fixes.Applied((DECODE_ONCE, fixes.WORKERS), ctx):
        served = DataLoader(dset.ImageFolder(pngs, transform=tutorial_transforms()), batch_size=16)
        flipped = DataLoader(dset.ImageFolder(pngs, transform=tutorial_transforms(transforms.RandomVerticalFlip())),
                             16)
    assert isinstance(served.dataset, DecodedOnce) and served.num_workers == 2  # with the workers fix's keywords
    assert served.dataset.classes == plain.classes  # the dataset's own attributes still read through it
    got = next(iter(DataLoader(served.dataset, batch_size=16)))  # no workers started here
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not isinstance(flipped.dataset, DecodedOnce)
    assert not isinstance(DataLoader(plain).dataset, DecodedOnce)  # undone on exit
    skipped = fixes.DecodeOnce(name=DECODE_ONCE, title="").not_applicable(dataclasses.replace(
        ctx, decode=("FaceFolder", "FaceFolder.__getitem__ is your own code")))
    assert skipped == "FaceFolder.__getitem__ is your own code"


@pytest.fixture(scope="module")
def faces(pngs, tmp_path_factory, steady_doctor):
    """One run of a script with its own Dataset (PIL in __getitem__) and a random flip, at tiny sizes; its phases
    taken to cost the same (`steady_doctor`), so the data wait is a share of the step whatever the machine does."""
    torch.set_num_threads(1)
    return doctor.run_script(SCRIPT, ["--dataroot", str(pngs), "--batch-size", "16", "--width", "8", "--nz", "16",
                                      "--epochs", "50", "--flip"], steps=2, warmup=1,
                             trace=tmp_path_factory.mktemp("faces") / "trace.json")


@pytest.mark.slow
def test_a_script_with_its_own_decoding_dataset_is_shown_the_lines_in_its_own_names(faces):
    seen = faces.settings["dataloaders"][0]["decode"]
    assert seen["dataset"] == "FaceFolder" and "Image.open" in seen["how"] and seen["keep"] == 2
    found = {f.kind: f for f in faces.findings}["decode-per-item"]
    assert "per-sample-transforms" not in faces.kinds() and "no-workers" not in faces.kinds()
    assert "your own code" in found.change.splitlines()[0] and "FaceFolder.__getitem__" in found.seen
    assert "dataset = dataloader.dataset" in found.change
    assert "batch_size=dataloader.batch_size" in found.change
    assert "imgs = imgs.to(device, non_blocking=True).float().div(127.5).sub(1)" in found.change
    assert "imgs.flip(3)" in found.change and "--image-size 32" in found.change


def test_the_lines_shown_run_and_give_the_batches_the_transforms_gave(pngs, tmp_path, monkeypatch):
    """The change executed as shown, in a script's names, over an ImageFolder with the tutorial's transforms: the
    tensor file's batches, normalised on the device, are the ones the DataLoader gave (to float rounding)."""
    r, facts = FIRES["decode-per-item"]
    names = {"loader": "dataloader", "loader_line": "train.py:30", "batch": "imgs", "batch_is_tuple": True,
             "device": "device"}
    change = rules.decode_per_item(dataclasses.replace(r, settings={**r.settings, "names": names}), facts).change
    plain = DataLoader(dset.ImageFolder(pngs, transform=tutorial_transforms()), batch_size=16)
    expected = torch.cat([x for x, _ in plain])
    monkeypatch.chdir(tmp_path)
    scope = {"torch": torch, "dataloader": plain, "device": torch.device("cpu")}
    setup, per_batch = change.split("\nimgs = ")
    exec(setup.replace("pin_memory=True", "pin_memory=False").replace("shuffle=True", "shuffle=False"), scope)
    batches = []
    for imgs, _ in scope["dataloader"]:
        scope["imgs"] = imgs
        exec("imgs = " + per_batch, scope)
        batches.append(scope["imgs"])
    assert scope["images"].dtype == torch.uint8 and (tmp_path / "decoded.pt").exists()
    assert torch.allclose(torch.cat(batches), expected, atol=1e-6)
    assert plain.dataset.transform.transforms[-1].__class__.__name__ == "Normalize"  # the dataset's own put back
