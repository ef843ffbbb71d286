"""02's technique cell is the tutorial's loop plus the lines mixed precision adds, and those lines train: a learner
who copies the lines marked `# new` into the loop printed above it gets exactly the step the notebook raced."""
import inspect
import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from gantools.workbook import tutorial
from conftest import cuda_only

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_mixed_precision.ipynb"
TINY = dict(nz=16, ngf=8, ndf=8, batch_size=16)


def technique_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and "def amp_step" in "".join(c["source"]))


def code_lines(lines) -> list[str]:
    """The code of each line without its comment and indentation (a `with` block indents the lines it wraps), blank
    lines and docstrings dropped."""
    code = [line.split("#")[0].strip() for line in lines]
    return [line for line in code if line and not line.startswith('"""')]


def amp_namespace(half: str, device: str) -> dict:
    """The technique cell run as the notebook runs it, after its setup cell chose `device` and `half`."""
    namespace = {"torch": torch, "F": F, "device": torch.device(device), "half": half}
    exec(technique_cell(), namespace)
    return namespace


def test_amp_step_is_the_tutorial_step_plus_lines_marked_new():
    cell = technique_cell()
    amp = cell[cell.index("def amp_step"):].splitlines()[1:]
    plain = inspect.getsource(tutorial.train_step).splitlines()[1:]
    replaced = [m.group(1).strip() for m in re.finditer(r"# new: was (.+)", cell)]
    assert replaced, "the new lines say which of the tutorial's lines they replace"
    kept = code_lines(line for line in amp if "# new" not in line)
    assert kept == [line for line in code_lines(plain) if line not in replaced]
    added = [line for line in cell.splitlines() if "# new" in line]
    assert sum("torch.autocast(device.type, dtype=dtype)" in line for line in added) == 3  # every forward pass
    assert sum("GradScaler(device.type, enabled=dtype == torch.float16)" in line for line in added) == 2


def test_amp_step_trains_in_bf16_with_its_scalers_off():
    namespace = amp_namespace("bf16", "cpu")
    gan = tutorial.plain_gan("cpu", **TINY)
    before = [p.detach().clone() for p in gan.G.parameters()]
    loss_d, loss_g = namespace["amp_step"](gan, next(gan.batches))
    assert torch.isfinite(loss_d) and torch.isfinite(loss_g)
    assert not namespace["scaler_d"].is_enabled() and not namespace["scaler_g"].is_enabled()
    assert any(not torch.equal(a, b) for a, b in zip(before, gan.G.parameters(), strict=True)), "G did not learn"


@cuda_only
def test_amp_step_trains_in_fp16_with_a_scaler_per_network():
    namespace = amp_namespace("fp16", "cuda")
    gan = tutorial.plain_gan("cuda", **TINY)
    for _ in range(3):
        loss_d, loss_g = namespace["amp_step"](gan, next(gan.batches))
    assert torch.isfinite(loss_d) and torch.isfinite(loss_g)
    scaler_d, scaler_g = namespace["scaler_d"], namespace["scaler_g"]
    assert scaler_d.is_enabled() and scaler_g.is_enabled() and scaler_d is not scaler_g
    assert scaler_d.get_scale() > 0 and scaler_g.get_scale() > 0
