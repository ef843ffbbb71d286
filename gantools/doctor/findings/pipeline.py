"""The change `decode-per-item` shows, in your script's names: the lines that decode every image once, with the
resizing and cropping your transforms already do (their steps before ToTensor), into a uint8 tensor saved to a file,
then batches indexed from that tensor and normalised on the device, so that what the model sees is what your
transforms made (to float rounding). Random steps cannot be decoded once (each epoch draws anew): they move onto the
decoded batch, and a RandomHorizontalFlip gets its per-image line."""
from __future__ import annotations

from . import names
from .report import DoctorReport


def _scaled(decode: dict) -> tuple:
    """(the expression that turns a uint8 batch into what your ToTensor and Normalize made, what it stands for)."""
    norm = decode["normalize"]
    if norm is None:
        return ".float().div(255)", "ToTensor"
    mean, std = norm
    if all(abs(v - 0.5) < 1e-6 for v in (*mean, *std)):
        return ".float().div(127.5).sub(1)", "ToTensor and Normalize(0.5, 0.5)"
    return (f".float().div(255).sub(torch.tensor({mean}, device={{device}}).view(1, -1, 1, 1))"
            f".div(torch.tensor({std}, device={{device}}).view(1, -1, 1, 1))", "ToTensor and Normalize")


def _decoded_file(r: DoctorReport, decode: dict) -> list:
    """The lines run once: each item through the kept steps and PILToTensor (uint8), stacked and saved."""
    n = names.yours(r)
    keep, steps = decode["keep"], decode["steps"]
    if n.get("loader") and not decode["wrapped"]:
        head = [f"dataset = {n['loader']}.dataset"]
    else:
        at = f" at your line {n['loader_line']}" if n.get("loader_line") else ""
        head = [f"dataset = ...  # the {decode['dataset']} your DataLoader{at} reads"]
    kept = ", ".join(steps[:keep]) or "nothing to resize"
    transform = (f"T.Compose([*full.transforms[:{keep}], T.PILToTensor()])  # your {kept}; then uint8, not "
                 "ToTensor" if decode["composed"] else
                 "T.PILToTensor()  # uint8: your transform's resizing and cropping first, not its ToTensor")
    return ["# once, before training (or in a script of its own): each image decoded a single time, at the size "
            "your transforms make, as uint8",
            "from torchvision import transforms as T", *head, "full = dataset.transform",
            f"dataset.transform = {transform}",
            "items = [dataset[i] for i in range(len(dataset))]", "dataset.transform = full",
            'torch.save((torch.stack([x for x, *_ in items]), torch.tensor([y for _, y, *_ in items])), '
            '"decoded.pt")']


def decoded_once_file(r: DoctorReport, loader: dict) -> str:
    """The finding's change, in your names (your DataLoader, its batch size, your batch's name, your device)."""
    decode, n = loader["decode"], names.yours(r)
    device = names.device(r)
    real, where = names.images(r)
    source = real if real != "real" else f"{n.get('batch', 'data')}[0]"
    scale, stands_for = _scaled(decode)
    target = n.get("loader") or "loader"
    batch_size = f"{n['loader']}.batch_size" if n.get("loader") else "..."
    at = f"  # your line {n['loader_line']}, over the file instead" if n.get("loader_line") else ""
    lines = _decoded_file(r, decode) + [
        "# every run: the file read once, batches indexed from it in memory, normalised on the device",
        'images, labels = torch.load("decoded.pt")',
        f"{target} = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), "
        f"batch_size={batch_size}, shuffle=True, pin_memory=True){at}",
        f"{real} = {source}.to({device}, non_blocking=True){scale.format(device=device)}"
        + (f"{where} ({stands_for})" if where else f"  # {stands_for}")]
    for step in decode["random"]:
        lines.append(
            f"{real} = torch.where(torch.rand(len({real}), 1, 1, 1, device={real}.device) < 0.5, {real}.flip(3), "
            f"{real})  # your RandomHorizontalFlip, per image, on the device" if step == "RandomHorizontalFlip" else
            f"# your {step} drew anew for each image every epoch: apply it to each decoded image of the batch")
    if decode["after"]:
        lines.append(f"# then your {', '.join(decode['after'])}, on the device")
    size = decode["size"] or "N"
    folder = decode["root"] or "YOUR_FOLDER"
    lines.append(f"# with gantools: gantools prepare {folder} --image-size {size} decodes the folder once (Resize, "
                 "CenterCrop) into a uint8 cache that its folder dataset reads, rebuilt when the folder changes")
    return "\n".join(lines)
