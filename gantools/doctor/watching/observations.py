"""What the doctor's hooks record about a loop it did not write: its models and optimizers (and which is G, which
is D), and the counts of the profiled window."""
from __future__ import annotations

import inspect
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from .frames import is_leaf

# The layouts a 2-d convolution runs in (`Window.formats`, the report's conv_input_formats; hooks' `_channels_last`)
CL, NCHW = "channels_last", "contiguous (NCHW)"


class Model:
    """A module with parameters called at the top level of your loop."""

    def __init__(self, module: nn.Module, name: str):
        inner = getattr(module, "_orig_mod", module)
        if isinstance(inner, nn.parallel.DistributedDataParallel):  # your network inside DDP: its class, its file
            inner = getattr(inner.module, "_orig_mod", inner.module)
        # torch.compile(module) wraps it; module.compile() compiles it in place
        self.module = module
        in_place = getattr(module, "_compiled_call_impl", None) is not None
        self.compiled = type(module).__name__ == "OptimizedModule" or in_place
        self._seen(name, type(inner).__name__, list(module.parameters()), _source_file(type(inner)))

    def _seen(self, name: str, cls: str, params: list, defined_in: str | None) -> None:
        self.name, self.cls = name, cls
        self.parameters, self.param_ids = sum(p.numel() for p in params), {id(p) for p in params}
        self.calls, self.out_shape, self.role, self.last_module = 0, None, None, None
        self.fed_by, self.sites = Counter(), Counter()
        self.locations = Counter()      # (file, line) -> calls from there, for source edits
        self.phase_sites = Counter()    # ((file, line), the Optimizer that stepped next) -> calls
        self.sigmoid_path = None  # where the nn.Sigmoid whose output it returns sits inside it
        self.outputs = None  # how many values it returns, where it returns a tuple (a two-headed D)
        self.head_sigmoid = None  # (which of those values, the nn.Sigmoid module that made it)
        self.sigmoid_output = None  # of a tuple it returns, the value `sigmoid_path` makes
        self.defined_in = defined_in  # the file of its class (or function), where a source edit of it goes

    def outputs_seen(self, output, sigmoids: list) -> None:
        """A call that returned a tuple: which of its values an nn.Sigmoid module made (its output, as is or viewed),
        when exactly one did: the adversarial head of a two-headed D (`validity, label = D(x)`)."""
        made = [(i, m) for i, x in enumerate(output) if isinstance(x, torch.Tensor) for m, y in sigmoids
                if x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() and x.numel() == y.numel()]
        self.outputs, self.head_sigmoid = len(output), made[0] if len(made) == 1 else None

    def describe(self) -> dict:
        return {"name": self.name, "class": self.cls, "parameters": self.parameters, "compiled": self.compiled,
                "output_shape": list(self.out_shape or ()), "last_module": self.last_module,
                "defined_in": self.defined_in, "called_at": [w for w, _ in self.sites.most_common(3)],
                "call_sites": [list(at) for at in self.locations],
                "steps_after_call": [[*at, o.role or o.name, n] for (at, o), n in self.phase_sites.items()]}


def _source_file(cls) -> str | None:
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None
    return os.path.abspath(path) if path else None


class FunctionModel(Model):
    """A network written as a plain function of tensors that an optimizer holds, with no nn.Module (`functions`):
    called, fed and timed as a module would be; its name is the one your code calls it by."""

    def __init__(self, code, name: str, params: list):
        self.module, self.code, self.compiled = None, code, False
        self._seen(name, "function", params, os.path.abspath(code.co_filename))


class Optimizer:
    """An optimizer your loop stepped, and the gradients that reached it."""

    def __init__(self, opt: torch.optim.Optimizer, name: str):
        self.opt, self.name, self.cls = opt, name, type(opt).__name__
        self.param_ids = {id(p) for group in opt.param_groups for p in group["params"]}
        self.steps = 0
        self.window_steps = 0
        self.role = self.model = None
        self.grads_from = Counter()  # model -> gradients accumulated into its parameters before this optimizer stepped

    def implementation(self, device: torch.device) -> str:
        d = self.opt.defaults
        if d.get("fused"):
            return "fused"
        if d.get("foreach"):
            return "foreach"
        if d.get("foreach") is False or "foreach" not in d:
            return "for-loop"
        # foreach=None: torch picks foreach for params on CUDA (optimizer._default_to_fused_or_foreach), else a loop
        return "foreach (default)" if device.type == "cuda" else "for-loop (default here)"


class Call:
    """One top-level call of a model; `next_opt` (the optimizer that steps next) tells D's step from G's."""

    __slots__ = ("model", "next_opt", "at")

    def __init__(self, model: Model, at=None):
        self.model, self.next_opt, self.at = model, None, at  # at: (file, line) of the call in your code


# What a model's input was: a model's output (G's images, detached or not), a tensor made in your loop with
# gradients (a penalty's mix of real and fake), a batch already fed to it in this iteration, or new data
MADE, DERIVED, AGAIN, DATA = "made by a model", "requires grad", "fed again", "data"
FED_KINDS = (MADE, DERIVED, AGAIN, DATA)


@dataclass
class Window:
    """What the hooks counted in the profiled window (from the profiler's warm-up iteration's end)."""

    images_loader: int = 0    # images in the batches your data gave
    batches: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    inputs: Counter = field(default_factory=Counter)   # (Model, what fed it: `FED_KINDS`) -> images fed to it
    data_sizes: Counter = field(default_factory=Counter)  # (Model, batch size) -> batches of data fed to it
    syncs: Counter = field(default_factory=Counter)    # FILE:LINE -> value reads from the device, and other syncs
    sites: dict = field(default_factory=dict)          # FILE:LINE -> (source line, method)
    located: int = 0                                   # of the syncs, those the sync watch placed (syncs.SyncWatch)
    dtypes: Counter = field(default_factory=Counter)   # (Conv/Linear output dtype, autocast) -> outputs
    formats: Counter = field(default_factory=Counter)  # the layout a convolution ran in -> convolutions
    penalties: Counter = field(default_factory=Counter)  # (Model, FILE:LINE, (file, line), code) -> gradient
    #                                                      penalty calls on that model's input (`penalties`)


@dataclass
class Observations:
    """Everything the hooks saw, for the analysis."""

    models: dict = field(default_factory=dict)        # id(module) -> Model
    optimizers: dict = field(default_factory=dict)    # id(optimizer) -> Optimizer
    constructed: list = field(default_factory=list)   # optimizers built while the doctor watched (script mode)
    built_at: dict = field(default_factory=dict)      # id(optimizer or DataLoader) -> (file, line) of its constructor
    ranges: dict = field(default_factory=dict)        # profiler range id -> Call or Optimizer
    data_site: str | None = None                      # where your loop takes its batches
    loaders: list = field(default_factory=list)
    epoch_starts: dict = field(default_factory=dict)  # id(DataLoader) -> ms from a new iterator to its first batch
    losses: Counter = field(default_factory=Counter)  # loss modules called at the top level
    networks: dict = field(default_factory=dict)      # Optimizer -> its FunctionModel, or None where none was found:
    #                                                   the optimizers whose parameters no nn.Module holds
    conv_shapes: defaultdict = field(default_factory=lambda: defaultdict(set))  # conv -> input shapes seen
    window: Window = field(default_factory=Window)
    peak_mem_mb: float = 0.0
    function_mode: bool = False  # the doctor's own torch function mode (`functions`) was pushed at some point
    memory: object = None  # the last warm-up iteration's `watching.memory.IterationMemory`
    compiler: dict = field(default_factory=dict)  # torch.compile's CompileCount over the whole run and after warm-up
    device: torch.device | None = None
    trainer: dict | None = None  # Lightning's Trainer that runs the loop (`lightning.TrainerWatch.describe`)
    counting: bool = True  # False once the profiled window has closed: the timed iterations after it are not counted

    def device_in_use(self) -> torch.device:
        """The device of the first model's (else optimizer's) parameters; the CPU until one is seen."""
        if self.device is None:
            for m in self.models.values():
                p = next(m.module.parameters(), None) if m.module is not None else None
                if p is not None:
                    self.device = p.device
                    break
            else:
                for o in self.optimizers.values():
                    for group in o.opt.param_groups:
                        if group["params"]:
                            self.device = group["params"][0].device
                            break
        return self.device or torch.device("cpu")

    def open_window(self) -> None:
        """Start counting afresh: the profiled window begins."""
        self.window, self.counting = Window(), True
        for o in self.optimizers.values():
            o.window_steps, o.grads_from = 0, Counter()

    def close_window(self) -> None:
        self.counting = False

    def role(self, role: str):
        """The Model (or Optimizer) classified as G or D, if any."""
        return next((m for m in self.models.values() if m.role == role), None)

    def optimizer_of(self, role: str):
        return next((o for o in self.optimizers.values() if o.role == role), None)

    def classify(self) -> None:
        """G is the model whose output is images and feeds another model, D the model fed by G (else the one
        returning one value per image); an MLP's G, whose images are flat rows (B, 784), is the model feeding the one
        that returns one value per image. An optimizer over one model's parameters is that model's."""
        models = list(self.models.values())
        images = [m for m in models if m.out_shape and len(m.out_shape) == 4 and m.out_shape[-1] > 1
                  and m.out_shape[-2] > 1]
        scalar = [m for m in models if m.out_shape and math.prod(m.out_shape[1:]) == 1]
        fed = _fed(models, images, scalar)
        if fed:
            g, d = max(fed, key=fed.get)
        else:
            g = max(images, key=lambda m: m.calls) if images else None
            d = max(scalar, key=lambda m: m.calls) if scalar else None
        for m, role in ((g, "G"), (d, "D")):
            if m is not None:
                m.role = role
        for o in self.optimizers.values():
            shared = {m: len(o.param_ids & m.param_ids) for m in models}
            owners = [m for m, k in shared.items() if k]
            if len(owners) == 1:  # an optimizer over one model's parameters
                o.role, o.model = owners[0].role or owners[0].name, owners[0].name
        if d is not None and d.module is not None:
            d.sigmoid_path = final_sigmoid(d.module) if d.outputs is None else _head_sigmoid(d)


def _fed(models: list, images: list, scalar: list) -> Counter:
    """(producer, consumer) -> calls, for the G and D candidates of `Observations.classify`: a model fed a model's
    images; without any, a model returning one value per image fed another model's output (an MLP's flat rows)."""
    fed = Counter()
    for m in models:
        for producer, n in m.fed_by.items():
            if producer in images:
                fed[(producer, m)] += n
    if not fed:
        for m in scalar:
            for producer, n in m.fed_by.items():
                if producer is not m and producer not in scalar:
                    fed[(producer, m)] += n
    return fed


def _head_sigmoid(d: Model) -> str | None:
    """The dotted path of the nn.Sigmoid that made one of the values a two-headed D returns (its adversarial head),
    wherever it sits in D (its last registered module may be another head's, a Softmax); that value's place in
    `sigmoid_output`."""
    if d.head_sigmoid is None:
        return None
    index, sigmoid = d.head_sigmoid
    path = next((name for name, m in d.module.named_modules() if m is sigmoid), None)
    d.sigmoid_output = index if path is not None else None
    return path


def final_sigmoid(module: nn.Module) -> str | None:
    """The dotted path of a Sigmoid that is the last module registered in `module`, if there is one."""
    leaves = [(name, m) for name, m in module.named_modules() if is_leaf(m)]
    if leaves and isinstance(leaves[-1][1], nn.Sigmoid):
        return leaves[-1][0]
    return None
