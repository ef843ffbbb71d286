"""Each of the doctor's rules on a constructed report and machine facts: where it fires and where it does not.
A CUDA machine is given as data (`MachineFacts`), so its rules are tested on this CPU too."""
import dataclasses

import pytest

from gantools.doctor import DoctorReport, MachineFacts, RULES, findings
from gantools.doctor.findings import rules

CPU = MachineFacts(cuda=False, bf16=True, workers=2, cpus=2)
A100 = MachineFacts(cuda=True, compute_capability=(8, 0), bf16=True, workers=4, cpus=16, cudnn_benchmark=False,
                    tf32=False, gpu="NVIDIA A100")
T4 = dataclasses.replace(A100, compute_capability=(7, 5), bf16=False, gpu="Tesla T4")
BY_NAME = {rule.__name__: rule for rule in RULES}


def loader(per_image_work=None, num_workers=0, pin_memory=False):
    return {"dataset": "ImageFolder", "batch_size": 64, "num_workers": num_workers, "pin_memory": pin_memory,
            "persistent_workers": False, "per_image_work": per_image_work, "not_decodable_once": None}


def decoded(*random, run_time=None, **changed) -> dict:
    """A `decode` as `watching.pipeline.decoding` describes a torchvision ImageFolder with the tutorial's transforms
    (and `random` steps after its crop)."""
    steps = ["Resize", "CenterCrop", *random, "ToTensor", "Normalize"]
    return {"dataset": "ImageFolder", "how": "ImageFolder's loader (PIL) opens and decodes each image file",
            "wrapped": False, "composed": True, "steps": steps, "keep": 2, "random": list(random), "after": [],
            "normalize": [[0.5] * 3, [0.5] * 3], "size": 64, "root": "data/faces", "run_time": run_time, **changed}


def report(device="cpu", phases=None, settings=None, **fields) -> DoctorReport:
    """A 100 ms iteration, busy 90 ms (half of it convolutions), with nothing wrong unless told."""
    base = {"conv_linear_outputs": {"bfloat16 (autocast)": 10.0}, "autocast": True,
            "conv_input_formats": {"channels_last": 5.0}, "fixed_conv_shapes": True, "dataloaders": [],
            "loss_ops_per_iteration": {}, "h2d_copy_ms": 0.0, "d_grads_in_g_step": 0, "d_final_sigmoid": None,
            "data_site": "train.py:40"}
    r = DoctorReport("train.py", device, complete=True, steps=5, step_time_ms=100.0, unprofiled_step_time_ms=95.0,
                     device_busy_ms=90.0, compute_share=0.4,
                     phases_ms={"data wait": 1.0, "G forward": 10.0, "D backward (G step)": 0.0, **(phases or {})},
                     settings={**base, **(settings or {})},
                     models={"G": {"name": "netG"}, "D": {"name": "netD"}},
                     optimizers={"G": {"name": "optimizerG", "role": "G", "class": "Adam", "implementation": "fused"},
                                 "D": {"name": "optimizerD", "role": "D", "class": "Adam",
                                       "implementation": "fused"}})
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def kinds(r, facts=CPU):
    return [f.kind for f in findings(r, facts)]


def test_a_clean_loop_has_no_findings():
    assert kinds(report()) == [] and kinds(report("cuda:0"), dataclasses.replace(A100, cudnn_benchmark=True)) == []


# what torch.compile did in a loop that compiled its models once and kept them (analysis._compiler's fields)
COMPILED = {"graphs": 3, "graph_breaks": 0, "break_reasons": [], "recompiles_after_warmup": 0,
            "iterations_after_warmup": 10, "recompile_reasons": []}


def memory(peak, room, **parts) -> dict:
    """A `settings["memory"]` as `memory_watch` describes one: G and D's activations all 32-bit."""
    parts = {"weights": 50.0, "gradients": 50.0, "optimizer state": 100.0, **parts}
    acts = parts.get("activations", 0.0)
    return {"peak_mb": peak, "room_mb": room, "parts_mb": parts, "largest": max(parts, key=parts.get),
            "activations_by_network_mb": {"G": 0.6 * acts, "D": 0.4 * acts},
            "activations_32bit_share": 1.0, "counted_by": "the CUDA allocator's count", "left_out": ""}


def penalty(calls=1.0, d_steps=1.0, ms=20.0, **phases) -> DoctorReport:
    """R1 at train.py:80 `calls` times per iteration, D stepping `d_steps` times, its gradient and double backward
    `ms` of the 100 ms iteration; D's Adam built at train.py:40 with StyleGAN2's settings."""
    site = {"where": "train.py:80", "at": ["/project/train.py", 80], "per_step": calls,
            "code": "grad = torch.autograd.grad(d_real.sum(), real, create_graph=True)[0]"}
    return report(phases={"D penalty": ms, **phases},
                  settings={"gradient_penalty": {"calls_per_iteration": calls, "sites": [site]}},
                  optimizers={"D": {"name": "opt_d", "role": "D", "class": "Adam", "implementation": "fused",
                                    "steps_per_iteration": d_steps, "built_at": ["/project/train.py", 40],
                                    "settings": {"lr": 0.002, "betas": (0.0, 0.99)}}})


FEEDS = {"where": "train.py:70", "code": "k = k + lambda_k * diff.item()", "method": "item", "per_step": 1.0,
         "reads": [], "feeds": {"how": "reaches `d_loss.backward()` at line 60 (through `k`, `d_loss`)",
                                "rewrite": "k = k + lambda_k * diff.detach()", "lines": [70]}}  # `editing.reads`
ROOMY = memory(1000.0, 80000.0, activations=600.0)   # batch 64 at 1 GB of an 80 GB GPU
FULL = memory(70000.0, 80000.0, activations=60000.0)  # activations fill a GPU near its limit
FIRES = {  # kind: (report, facts) where it fires; NOT_FIRING: the closest case where it must not
    "decode-per-item": (report(phases={"data wait": 40.0}, settings={"dataloaders": [
        {**loader("ImageFolder: a PIL decode per image"), "decode": decoded()}]}), CPU),
    "per-sample-transforms": (report(phases={"data wait": 40.0},
                                     settings={"dataloaders": [loader("ImageFolder: a PIL decode per image")]}), CPU),
    "no-workers": (report(phases={"data wait": 40.0}, settings={"dataloaders": [loader()]}), CPU),
    "too-many-workers": (report(settings={"dataloaders": [loader(num_workers=16)]}), CPU),  # Lightning's example
    "workers-restart": (report(settings={"dataloaders": [  # 2.5 s to restart spawned workers, 4 batches an epoch
        {**loader(num_workers=2), "epoch_start_ms": 2500.0, "batches_per_epoch": 4}]}), CPU),
    "pin-memory": (report("cuda:0", settings={"h2d_copy_ms": 10.0, "dataloaders": [loader(num_workers=4)]}),
                   dataclasses.replace(A100, cudnn_benchmark=True)),
    "host-sync": (report(host_syncs_per_step=3.0, device_busy_ms=50.0,
                         sync_sites=[{"where": "train.py:60", "code": "loss.item()", "method": "item",
                                      "per_step": 3.0}]), dataclasses.replace(A100, cudnn_benchmark=True)),
    "read-feeds-training": (report(host_syncs_per_step=1.0, sync_sites=[FEEDS]), CPU),
    "sigmoid-bce": (report(settings={"loss_ops_per_iteration": {"aten::binary_cross_entropy": 3.0},
                                     "d_final_sigmoid": "main.12"}), CPU),
    "fp32-convolutions": (report(settings={"conv_linear_outputs": {"float32": 10.0}, "autocast": False}), CPU),
    "d-grads-in-g-step": (report(phases={"D backward (G step)": 20.0}, settings={"d_grads_in_g_step": 10.0}), CPU),
    "g-grads-in-d-step": (report(phases={"G backward (D step)": 20.0}, settings={"g_grads_in_d_step": 80.0}), CPU),
    "optimizer-for-loop": (report(phases={"G optimizer step": 4.0, "D optimizer step": 4.0},
                                  optimizers={"G": {"name": "optimizerG", "role": "G", "class": "Adam",
                                                    "implementation": "for-loop (default here)"}}), CPU),
    "channels-last": (report(compute_share=0.8, settings={"conv_input_formats": {"contiguous (NCHW)": 5.0}}), CPU),
    "cudnn-benchmark": (report("cuda:0", compute_share=0.8), A100),
    "tf32": (report("cuda:0", settings={"conv_linear_outputs": {"float32": 10.0}, "autocast": False}),
             dataclasses.replace(A100, cudnn_benchmark=True)),
    "recompiles": (report(settings={"compiler": {**COMPILED, "recompiles_after_warmup": 2,
                                                 "recompile_reasons": ["0/0: GLOBAL_STATE changed: grad_mode"]}}), CPU),
    "graph-breaks": (report(settings={"compiler": {**COMPILED, "graph_breaks": 1, "graphs": 4,
                                                   "break_reasons": ["Unsupported Tensor.item() call"]}}), CPU),
    "batch-below-memory": (report("cuda:0", settings={"memory": ROOMY}, batch_size=64), A100),
    "activation-memory": (report("cuda:0", settings={"memory": FULL, "autocast": False}, batch_size=64), A100),
    "gradient-penalty-every-step": (penalty(), CPU),
}
NOT_FIRING = {
    "decode-per-item": (report(phases={"data wait": 2.0}, settings={"dataloaders": [  # under 5% of the step
        {**loader("ImageFolder: a PIL decode per image"), "decode": decoded()}]}), CPU),
    "per-sample-transforms": (report(phases={"data wait": 2.0},  # waiting under 5% of the step: not worth it
                                     settings={"dataloaders": [loader("ImageFolder: a PIL decode per image")]}), CPU),
    "no-workers": (report(phases={"data wait": 40.0}, settings={"dataloaders": [loader(num_workers=4)]}), CPU),
    "too-many-workers": (report(settings={"dataloaders": [loader(num_workers=2)]}), CPU),  # one per core
    "workers-restart": (report(settings={"dataloaders": [  # forked workers, 1,000 batches an epoch: 0.05 ms each
        {**loader(num_workers=2), "epoch_start_ms": 50.0, "batches_per_epoch": 1000}]}), CPU),
    "pin-memory": (FIRES["pin-memory"][0], CPU),  # no GPU: nothing to pin for
    "host-sync": (report(host_syncs_per_step=0.5), A100),  # one read every other iteration
    "read-feeds-training": (report(host_syncs_per_step=1.0, sync_sites=[{**FEEDS, "feeds": None}]), CPU),  # shown
    "sigmoid-bce": (report(settings={"loss_ops_per_iteration": {"aten::binary_cross_entropy_with_logits": 3.0}}),
                    CPU),
    "fp32-convolutions": (report(device_busy_ms=1.0, settings={"conv_linear_outputs": {"float32": 10.0},
                                                               "autocast": False}), CPU),  # too small to gain 2%
    "d-grads-in-g-step": (report(phases={"D backward (G step)": 20.0}, settings={"d_grads_in_g_step": 0}), CPU),
    "g-grads-in-d-step": (report(phases={"G backward (D step)": 20.0}, settings={"g_grads_in_d_step": 0}), CPU),
    "optimizer-for-loop": (report(phases={"G optimizer step": 1.0},  # optimizer steps under 5% of the step
                                  optimizers={"G": {"name": "optimizerG", "role": "G", "class": "Adam",
                                                    "implementation": "for-loop"}}), CPU),
    "channels-last": (report(compute_share=0.3, settings={"conv_input_formats": {"contiguous (NCHW)": 5.0}}), CPU),
    "cudnn-benchmark": (report("cuda:0", compute_share=0.8), dataclasses.replace(A100, cudnn_benchmark=True)),
    "tf32": (FIRES["tf32"][0], dataclasses.replace(T4, cudnn_benchmark=True)),  # no TF32 before Ampere
    "recompiles": (report(settings={"compiler": COMPILED}), CPU),  # compiled in the warm-up, never again
    "graph-breaks": (report(settings={"compiler": COMPILED}), CPU),
    "batch-below-memory": (report(settings={"memory": ROOMY}, batch_size=64), CPU),  # a CPU swaps: no room to judge
    "activation-memory": (report("cuda:0", settings={"memory": ROOMY}, batch_size=64), A100),  # room to spare
    "gradient-penalty-every-step": (penalty(calls=0.25), CPU),  # lazy already: one D step in four
}


def test_every_rule_is_covered():
    assert {f.__name__.replace("_", "-") for f in RULES} == set(FIRES) == set(NOT_FIRING)


@pytest.mark.parametrize("kind", sorted(FIRES))
def test_rule_fires(kind):
    r, facts = FIRES[kind]
    rule = BY_NAME[kind.replace("-", "_")]
    found = rule(r, facts)
    assert found is not None and found.kind == kind and found.seen and found.change and found.notebook
    assert kind in kinds(r, facts)


@pytest.mark.parametrize("kind", sorted(NOT_FIRING))
def test_rule_does_not_fire(kind):
    r, facts = NOT_FIRING[kind]
    assert BY_NAME[kind.replace("-", "_")](r, facts) is None
    assert kind not in kinds(r, facts)


def test_findings_are_ranked_by_estimated_gain():
    r = report(phases={"data wait": 40.0, "D backward (G step)": 20.0},
               settings={"dataloaders": [loader()], "d_grads_in_g_step": 10.0,
                         "loss_ops_per_iteration": {"aten::binary_cross_entropy": 3.0}})
    found = findings(r, CPU)
    assert [f.kind for f in found] == ["no-workers", "d-grads-in-g-step", "sigmoid-bce"]
    assert found[0].estimated_speedup == pytest.approx(100 / 60) and found[2].estimated_speedup is None


@pytest.mark.slow_bf16
def test_a_cpu_without_native_bf16_gets_no_autocast_advice():
    """Emulated bf16 runs slower than fp32 (docs/profiling.md): the doctor proposes no 16-bit autocast there."""
    import torch

    from gantools.doctor.diagnosis.analysis import machine_facts

    facts = machine_facts(torch.device("cpu"))
    assert facts.bf16 and not facts.fast16  # it runs, and it is slow
    r = FIRES["fp32-convolutions"][0]
    assert rules.fp32_convolutions(r, CPU) is not None and rules.fp32_convolutions(r, facts) is None


def test_the_machine_facts_shape_the_advice():
    r = FIRES["fp32-convolutions"][0]
    assert "bfloat16" in rules.fp32_convolutions(r, A100).change
    assert "float16" in rules.fp32_convolutions(r, T4).change and "GradScaler" in rules.fp32_convolutions(r, T4).change
    assert "num_workers=4" in rules.no_workers(FIRES["no-workers"][0], A100).change
    assert "NVIDIA A100" in rules.tf32(*FIRES["tf32"]).seen
    nchw = FIRES["channels-last"][0]
    fp32 = dataclasses.replace(nchw, settings={**nchw.settings, "autocast": False,
                                               "conv_linear_outputs": {"float32": 10.0}})
    assert rules.channels_last(fp32, CPU) is None and rules.fp32_convolutions(fp32, CPU)  # 16-bit comes first


def test_fp16_advice_names_fused_optimizers_whose_gradscaler_step_needs_no_host_sync():
    """GradScaler.step reads found_inf with `.item()` (a host sync per optimizer step) unless the optimizer is fused
    (pytorch/pytorch#80167): the fp16 snippet says so for optimizers that are not, and not for fused ones."""
    r = FIRES["fp32-convolutions"][0]
    foreach = dataclasses.replace(r, optimizers={role: {**o, "implementation": "foreach (default)"}
                                                 for role, o in r.optimizers.items()})
    change = rules.fp32_convolutions(foreach, T4).change
    assert "optimizerD = torch.optim.Adam(..., fused=True)" in change and "optimizerG" in change
    assert "fused=True" not in rules.fp32_convolutions(r, T4).change  # already fused
    assert "fused=True" not in rules.fp32_convolutions(foreach, A100).change  # bf16: no GradScaler


# -- one object per fix, and the verdict's type ------------------------------------------------------------------------
def test_a_fix_is_one_class_that_candidates_applied_make_patch_and_lightning_all_go_through(tmp_path, monkeypatch):
    """A fix added to `FIXES` as one class, with its own run-time change, forward wrapper and source edit (an
    `editing.Edit` of its own, made in the patch's one pass), is answered, installed for a run and undone, written
    into the patch, and mapped to a Trainer argument where Lightning runs the loop: `candidates`, `Applied`,
    `make_patch` and the Lightning mapping loop over the fix objects, with no branch of their own per fix."""
    from dataclasses import dataclass, field

    import libcst as cst
    import torch

    from gantools.doctor.editing.edit import Edit
    from gantools.doctor.fixes import catalogue as fixes
    from gantools.doctor.fixes.fix import Fix
    from gantools.doctor.patching import patch as patching
    from gantools.doctor.watching.lightning import trainer_arguments

    class Target:
        value = "as written"

    @dataclass
    class MarkEdit(Edit):
        at: set = field(default_factory=set)
        name = "marker"

        def statement(self, original, group):
            if set(self.lines(original)) & self.at and len(group) == 1:
                self.done.add(self.name)
                return [*group, cst.parse_statement("marked = True  # the marker's edit\n")]
            return group

    class Marker(Fix):
        def install(self, applied):
            applied.patch(Target, "value", "fixed")

        def wrap(self, applied, module, role, forward):
            return (lambda *args, **kwargs: forward(*args, **kwargs) * 0) if role == "G" else None

        def trainer_keywords(self, bf16):
            return {"marker": "True"}

        def plan(self, plans, report, ctx, by_hand):
            plans[report.source].of(MarkEdit).at.add(2)

        def missed(self, plan, shown):
            return [] if "marker" in plan.done or not plan.of(MarkEdit) else [("marker", f"{shown}: nothing marked")]

    marker = Marker(name="marker", title="a marker", answers=("host-sync",))
    monkeypatch.setattr(fixes, "FIXES", (*fixes.FIXES, marker))
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = 1\ny = 2\n")
    r = report(source=str(script), models={}, findings=findings(*FIRES["host-sync"]))
    assert marker in fixes.candidates(r, CPU)[0]
    g = torch.nn.Linear(2, 2)
    ctx = dataclasses.replace(fixes.context(r, CPU), g=("Linear", 6))
    with fixes.Applied(("marker",), ctx):
        assert Target.value == "fixed"
        g(torch.ones(1, 2))  # first sight: found as G, its forward wrapped from the next call on
        assert not g(torch.ones(1, 2)).any()
    assert Target.value == "as written" and g(torch.ones(1, 2)).any()  # undone on exit
    assert "forward" not in g.__dict__
    patch = patching.make_patch(("marker",), r, ctx, root=tmp_path)
    assert "+marked = True  # the marker's edit" in patch.diff and patch.files == ["train.py"], patch
    assert patch.diff.index("x = 1") < patch.diff.index("+marked") < patch.diff.index("y = 2")
    assert not patch.by_hand
    r.settings["lightning"] = {"built_at": None}
    assert trainer_arguments(marker, r, True) == {"marker": "True"}


def test_the_verdict_is_typed_and_its_json_keeps_its_two_fields():
    from gantools.doctor.findings.report import Verdict

    r = report(verdict=Verdict(bottleneck="compute-bound", evidence={"step ms": 100.0, "heaviest ops": "conv"}))
    assert r.to_dict()["verdict"] == {"bottleneck": "compute-bound", "evidence": {"step ms": 100.0,
                                                                                  "heaviest ops": "conv"}}
    assert list(r.to_dict()["verdict"]) == ["bottleneck", "evidence"]
    assert report(verdict=None).to_dict()["verdict"] == {}  # not profiled: an empty object, as before


def test_what_fits_is_a_lower_bound_from_one_batch_and_the_advice_stays_near_the_batch():
    """Weights and optimizer state (150 MB) are live whatever the batch; the other 850 MB of the 1,000 MB peak taken
    to grow with it: 64 x (80,000 - 150) / 850 images fit; the change offers 8x, not all of it; a batch at a
    quarter of what fits or more is left alone."""
    from gantools.doctor.findings import memory as memory_rules
    assert memory_rules.fits_at_least(ROOMY, 64) == 6012
    found = memory_rules.batch_below_memory(*FIRES["batch-below-memory"])
    assert "about 6012 fits" in found.seen and "batch_size=512" in found.change and "sqrt(8)" in found.change
    assert memory_rules.batch_below_memory(report("cuda:0", settings={"memory": memory(1000.0, 3000.0,
                                                                               activations=600.0)}, batch_size=64),
                                           A100) is None  # 64 x 2850 / 850 = 214 < 4 x 64


def test_activation_memory_offers_16_bit_only_where_activations_are_32_bit():
    r, facts = FIRES["activation-memory"]
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in rules_of(r, facts).change
    assert "float16" in rules_of(r, T4).change and "GradScaler" in rules_of(r, T4).change
    assert "use_reentrant=False" in rules_of(r, facts).change
    r.settings["autocast"] = True
    assert "autocast" not in rules_of(r, facts).change and "checkpoint(block" in rules_of(r, facts).change


def rules_of(r, facts):
    from gantools.doctor.findings import memory as memory_rules
    return memory_rules.activation_memory(r, facts)


def test_a_gradient_penalty_at_every_d_step_is_worth_a_finding_by_its_measured_share():
    """Its gain is Amdahl's on the penalty's share saved 15 times in 16; a WGAN-GP's five critic steps with five
    penalties is every step too; under 5% of the iteration it is not worth a finding."""
    from gantools.doctor.findings import penalties as penalty_rules
    found = penalty_rules.gradient_penalty_every_step(penalty(), CPU)
    assert found.estimated_speedup == pytest.approx(100 / (100 - 20 * 15 / 16))
    assert "train.py:80 `grad = torch.autograd.grad(d_real.sum(), real, create_graph=True)[0]` (1/it)" in found.seen
    assert "20.0 ms of a 100.0 ms iteration (20%" in found.seen and "by design" in found.why
    assert penalty_rules.gradient_penalty_every_step(penalty(calls=5.0, d_steps=5.0), CPU) is not None
    assert penalty_rules.gradient_penalty_every_step(penalty(calls=14 / 3, d_steps=4.67), CPU)  # D's steps rounded
    assert penalty_rules.gradient_penalty_every_step(penalty(ms=4.0), CPU) is None


def test_the_lazy_form_corrects_d_adam_as_stylegan2_does():
    """StyleGAN2's D: Adam(lr=0.002, betas=(0, 0.99)), R1 every 16 minibatches in a step of its own: c = 16/17, so
    lr 0.002 * 16/17 = 0.00188 and beta2 0.99 ** (16/17) = 0.99058 (its training loop's `mb_ratio`)."""
    from gantools.doctor.findings import penalties as penalty_rules
    lr, betas = penalty_rules.lazy_adam(0.002, (0.0, 0.99))
    assert lr == pytest.approx(0.0018823529) and betas == pytest.approx((0.0, 0.9905849))
    change = penalty_rules.gradient_penalty_every_step(penalty(), CPU).change
    assert "opt_d = torch.optim.Adam(..., lr=0.00188, betas=(0, 0.9906))  # at /project/train.py:40" in change
    assert "if d_steps % 16 == 0:" in change and "(16 * penalty).backward()" in change
    unknown = penalty()
    unknown.optimizers["D"]["settings"] = {}
    assert "lr=lr * 16 / 17, betas=(beta1 ** (16 / 17), beta2 ** (16 / 17))" in \
        penalty_rules.gradient_penalty_every_step(unknown, CPU).change
