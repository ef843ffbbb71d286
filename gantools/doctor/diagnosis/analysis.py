"""From what the hooks saw and the profiler recorded to a `DoctorReport`: the phases (each profiler range named
G forward, D forward (G step), ..., backward time attributed through autograd's sequence numbers), the device's
busy time, the settings your loop ran with, the machine's facts, the verdict and the findings."""
from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core.checkpoint import atomic_write
from ...measuring import hardware
from ...measuring.compile_counts import first_lines
from ...measuring.load import doubts
from ...measuring.protocol import OWN_SYNC, code_syncs, spans
from ...measuring.protocol import PHASES as ORDER  # the trainer's phase names, in the same order
from ...speed.profiling import bottleneck, compute_ms, device_time, suggested_workers
from ..editing.names import your_names
from ..editing.reads import follow_sites
from ..watching.hooks import COUNTED_READ, RANGE
from ..watching.lightning import in_trainer_terms
from ..watching.lightning import settings as lightning_settings
from ..watching.observations import DATA, Call, Observations, Optimizer
from ..watching.penalties import PENALTY, described, penalty_spans, within
from ..watching.pipeline import describe_loader
from ..findings.report import DoctorReport, Verdict
from ..findings.rules import G_BACKWARD_IN_D_STEP, MachineFacts, findings, not_judged
from ..watching.schedule import Schedule
from ..watching.syncs import NOT_LOCATED

OTHER = "other (your code)"
MODE_STACK_GUARD = "___check_torch_function_mode_stack"  # dynamo's guard on the torch function modes pushed


@dataclass
class Run:
    """How the doctor was asked to watch: where the report says it came from, what one iteration is."""

    source: str
    iteration: str
    by_optimizer: bool
    trace_request: object = None


def default_trace(source: str) -> Path:
    stem = re.sub(r"\W+", "_", Path(source).stem)  # a script's name, or your step function's
    return Path("runs") / "doctor" / f"{stem}-trace.json"


def machine_facts(device: torch.device) -> MachineFacts:
    """The machine as the rules see it, read once, here."""
    if device.type != "cuda":
        return MachineFacts(cuda=False, bf16=hardware.supports_bf16(device), fast16=hardware.fast_16bit(device),
                            workers=suggested_workers(), cpus=_cpus())
    return MachineFacts(cuda=True, compute_capability=tuple(torch.cuda.get_device_capability(device)),
                        bf16=hardware.supports_bf16(device), fast16=hardware.fast_16bit(device),
                        workers=suggested_workers(), cudnn_benchmark=torch.backends.cudnn.benchmark,
                        tf32=hardware.tf32_matmuls(), gpu=torch.cuda.get_device_name(device), cpus=_cpus())


def _cpus() -> int:
    """The cores this process may run on (a container's limit, where the OS reports it), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def analyse(obs: Observations, sched: Schedule, run: Run) -> DoctorReport:
    obs.classify()
    device = obs.device_in_use()
    report = DoctorReport(run.source, str(device), iterations_seen=max(sched.marks, 0))
    report.models = {m.role or m.name: m.describe() for m in obs.models.values()}
    report.missing = _not_found(obs)
    n = max(sched.profiled, 1)
    report.optimizers = {
        o.role or o.name: {"name": o.name, "class": o.cls, "implementation": o.implementation(device),
                           "role": o.role, "model": o.model,
                           "built": _index(obs.constructed, o.opt), "built_at": _at(obs.built_at.get(id(o.opt))),
                           "steps_per_iteration": round(o.window_steps / n, 2) if sched.profiled else None,
                           "settings": {k: v for k, v in o.opt.defaults.items() if k in ("lr", "betas",
                                                                                        "weight_decay")}}
        for o in obs.optimizers.values()}
    report.unprofiled_step_time_ms = sched.timed_ms
    report.host_budget = sched.host_budget
    facts = machine_facts(device)
    report.settings = _settings(obs, sched, device, facts)
    report.settings["memory"] = obs.memory.describe() if obs.memory is not None else None
    report.settings["timed_iterations_ms"] = [round(ms, 2) for ms in (sched.clock.times_ms if sched.clock else [])]
    if sched.pacer is not None:
        report.settings["iteration"] = f"one step of {sched.pacer.name}" + (
            f" ({sched.pacer.role}'s optimizer)" if sched.pacer.role else "")
    elif not run.by_optimizer:
        report.settings["iteration"] = run.iteration
    w = obs.window
    if w.images_loader:
        report.images_per_step = w.images_loader / n
        report.batch_size = w.batch_sizes.most_common(1)[0][0]
        batches = w.batches / n
        report.images_source = (f"{batches:g} batch{'es' if batches != 1 else ''} of {report.batch_size} per "
                                "iteration from your data")
    if not sched.done or not sched.profiled:
        report.note = report.note or _incomplete_note(sched)
        return report
    _profile_into(report, obs, sched, run)
    report.timings_doubted = timing_doubts(report)
    report.complete = True
    report.settings["data_site"] = obs.data_site
    report.settings["names"] = your_names(report)  # the snippets' words for your script's things
    report.findings = in_trainer_terms(findings(report, facts), report, facts.bf16)
    report.not_judged = not_judged(facts)
    _in_your_code(report, facts)
    return report


def timing_doubts(report: DoctorReport) -> list:
    """Why this run's timings are not the loop's own (`measuring.load.doubts`: other processes' CPU time while it was
    measured, a profiler overhead no quiet machine gives), or none."""
    timed = report.unprofiled_step_time_ms
    overhead = report.step_time_ms / timed if timed and timed == timed else None
    return doubts(report.settings.get("machine_load"), overhead)


def _in_your_code(report: DoctorReport, facts: MachineFacts) -> None:
    """Each finding's change as a diff of your own lines, where its fix can be made as a source edit, and the lines
    to change by hand where it cannot."""
    from ..fixes.catalogue import context, parts_for
    from ..patching.patch import make_patch

    ctx = context(report, facts)
    for f in report.findings:
        parts = parts_for(f.kind, ctx)
        if parts:
            patch = make_patch(parts, report, ctx)
            f.patch, f.by_hand = patch.diff, "\n".join(why for _, why in patch.by_hand)


def _index(items: list, obj) -> int | None:
    """Where `obj` is in `items` by identity (an optimizer's place in construction order): a later run of the same
    script builds its optimizers in the same order."""
    return next((i for i, x in enumerate(items) if x is obj), None)


def _at(location) -> list | None:
    return list(location) if location else None


def _incomplete_note(sched: Schedule) -> str:
    if sched.by_optimizer and sched.pacer is None:
        return ("the loop ended before the doctor could tell its rhythm (it needs every optimizer to step, "
                "and one to step twice)")
    return (f"the doctor had seen {max(sched.marks, 0)} of the {sched.needed} iterations it measures "
            f"({sched.warmup} warm-up, 1 + {sched.steps} profiled, {sched.timed} timed): run it longer, or lower "
            "--warmup/--steps")


def _profile_into(r: DoctorReport, obs: Observations, sched: Schedule, run: Run) -> None:
    session, n = sched.session, sched.profiled
    events = session.prof.events()
    r.steps = n
    r.step_time_ms = session.step_ms()
    phases = _phases(events, obs)
    per_step = {k: v / n for k, v in phases.items()}
    ordered = {k: per_step[k] for k in (*ORDER[:5], G_BACKWARD_IN_D_STEP, *ORDER[5:]) if k in per_step}
    ordered.update({k: v for k, v in per_step.items() if k not in ordered})
    ordered[OTHER] = max(r.step_time_ms - sum(ordered.values()), 0.0)
    r.phases_ms = ordered
    cuda = obs.device_in_use().type == "cuda"
    averages = session.averages
    wait = ordered.get("data wait", 0.0)
    busy, h2d, ops = device_time(averages, n, r.step_time_ms, wait, cuda,
                                 skip=lambda k: k.startswith(RANGE) or k in ORDER)
    r.device_busy_ms, r.top_ops = busy, ops[:10]
    r.compute_share = compute_ms(ops) / max(busy, 1e-9)
    r.settings["loss_ops_per_iteration"] = {e.key: e.count / n for e in averages
                                            if "binary_cross_entropy" in e.key and "backward" not in e.key}
    r.settings["h2d_copy_ms"] = h2d
    r.peak_mem_mb = obs.peak_mem_mb
    w = obs.window
    r.sync_sites = [{"where": where, "code": w.sites[where][0], "method": w.sites[where][1],
                     "per_step": round(count / n, 2)} for where, count in w.syncs.most_common()]
    follow_sites(r.sync_sites)  # which reads feed training, which are only shown
    unplaced = _unplaced_syncs(r, spans(events), w.located, n) if cuda else 0.0
    r.host_syncs_per_step = sum(w.syncs.values()) / n + unplaced
    if not r.images_per_step:
        _images_without_loader(r, obs, n)
    r.verdict = _verdict(r, wait, busy, ops, cuda)
    try:
        r.trace_path = _export_trace(session.prof, obs, run)
    except OSError as e:  # the measurements stand without the trace: say why there is none
        r.note = (r.note + " " if r.note else "") + f"no trace written ({e})"


def _phases(events: list, obs: Observations) -> dict:
    """Milliseconds in each phase over the profiled iterations: each labelled range, data waits, host syncs and a
    gradient penalty's gradient, and each backward node charged to the phase whose op made it (the penalty's: the
    double backward, `penalties`). A backward run inside autograd.grad is the penalty range's own time already."""
    phases: dict = defaultdict(float)
    spans, made = penalty_spans(events)
    seq: dict = dict.fromkeys(made, PENALTY)
    steps = []  # (start, label) of each optimizer step
    for e in events:
        if e.name.startswith(RANGE):
            label = _label(obs.ranges.get(int(e.name[len(RANGE):])))
            phases[label] += e.cpu_time_total / 1e3
            if label.endswith("optimizer step"):
                steps.append((e.time_range.start, label))
            if "forward" in label:
                stack = list(e.cpu_children)
                while stack:
                    c = stack.pop()
                    if c.sequence_nr >= 0:
                        seq[(c.thread, c.sequence_nr)] = label.replace("forward", "backward")
                    stack.extend(c.cpu_children)
        elif e.name in ("data wait", "host sync", PENALTY):
            phases[e.name] += e.cpu_time_total / 1e3
    backward = sorted((e for e in events if e.name.startswith("autograd::engine::evaluate_function")
                       and not (spans and within(spans, e))), key=lambda e: e.time_range.start)
    # A backward node's event carries the sequence number and the forward thread of the op that made it
    # (ATen's record_function.h: forwardThreadId "used alongside with sequence number to correlate backward
    # functions with the forward ones"; FunctionEvent.fwd_thread, .sequence_nr). On CUDA the backward runs on
    # the autograd engine's device thread, so the match is on (fwd_thread, sequence_nr), not on the thread.
    _charge_backward(backward, seq, steps, phases)
    return phases


def _charge_backward(backward: list, seq: dict, steps: list, phases: dict) -> None:
    """Each backward node's time into the phase of the forward op that made it (`seq`); G's backward run before
    D's optimizer stepped (the next step in `steps`, (start, label)) is D's loss backpropagated into G."""
    last = {}
    for e in backward:  # AccumulateGrad has no sequence number: it belongs to the node run just before it
        label = seq.get((e.fwd_thread, e.sequence_nr)) if e.sequence_nr >= 0 else None
        label = label or (last.get(e.thread) if "AccumulateGrad" in e.name else None)
        if label == "G backward" and _next_step(steps, e.time_range.start) == "D optimizer step":
            label = G_BACKWARD_IN_D_STEP
        if label:
            phases[label] += e.cpu_time_total / 1e3
            last[e.thread] = label


def _next_step(steps: list, at: float) -> str | None:
    """The label of the first optimizer step that starts after `at` (`steps`: (start, label), in any order)."""
    after = [(start, label) for start, label in steps if start > at]
    return min(after)[1] if after else None


def _verdict(r: DoctorReport, wait: float, busy: float, ops: list, cuda: bool) -> Verdict:
    """The bottleneck, decided by the profiler's one rule (`speed.profiling.bottleneck`), with the numbers it read."""
    evidence = {"step ms": r.step_time_ms, "data wait share": wait / r.step_time_ms}
    if cuda:
        evidence["GPU idle share"] = 1 - busy / r.step_time_ms
    evidence["conv/matmul share of busy"] = r.compute_share
    evidence["heaviest ops"] = ", ".join(name for name, _ in ops[:3])
    return Verdict(bottleneck=bottleneck(r.step_time_ms, wait, busy, r.compute_share, cuda), evidence=evidence)


def _unplaced_syncs(r: DoctorReport, events: list, located: int, n: int) -> float:
    """The profiler's cuda*Synchronize calls per iteration that are your loop's but that neither the Tensor-method
    patches (their reads are inside "host sync" or COUNTED_READ ranges) nor the sync watch placed (`located` of
    them): a site of their own, "not located". gantools' own synchronisations are never counted."""
    mine = code_syncs(events)
    r.settings["cuda_syncs_per_iteration"] = len(mine) / n
    unplaced = max(len(code_syncs(events, skip=(OWN_SYNC, "host sync", COUNTED_READ))) - located, 0) / n
    if unplaced:
        r.sync_sites.append({"where": "elsewhere", "code": "", "method": NOT_LOCATED, "per_step": round(unplaced, 2)})
    return unplaced


def _images_without_loader(r: DoctorReport, obs: Observations, n: int) -> None:
    """No DataLoader and no doc.data(): the real images are the batches of data D was fed, each once an iteration
    (every critic step's; not a batch drawn and never fed to D, not G's images, detached or not, nor a tensor with
    gradients made in your loop, such as a penalty's mix of real and fake: `hooks.Hooks.called`). Where D, or a
    network whose images D may be fed, was not found, or D was fed no such batch, the count stays unknown (None)."""
    d = obs.role("D")
    lost = [o.name for o, m in obs.networks.items() if m is None]
    if d is None or lost:
        unfound = "D" if d is None else f"the network {' and '.join(lost)} train{'s' if len(lost) == 1 else ''}"
        r.images_source = f"no DataLoader seen, and {unfound} not found"
        return
    w = obs.window
    sizes = Counter({size: k for (m, size), k in w.data_sizes.items() if m is d})
    if not sizes:
        r.images_source = "no DataLoader seen, and D was fed no batch that G did not make"
        return
    r.images_per_step = w.inputs[(d, DATA)] / n
    r.batch_size = sizes.most_common(1)[0][0]
    batches = sum(sizes.values()) / n
    r.images_source = (f"no DataLoader seen: {batches:g} batch{'es' if batches != 1 else ''} of {r.batch_size} per "
                       f"iteration fed to {d.name} that no model made")


def _not_found(obs: Observations) -> list:
    """The parts of the loop the doctor could not find, each in a line of the report."""
    out = [f"the network {o.name} trains: no nn.Module holds its parameters and no function of yours computes with "
           "them alone (written inline in the loop?), so its forward is neither timed nor told apart"
           for o, m in obs.networks.items() if m is None]
    roles = [role for role in ("G", "D") if obs.role(role) is None]
    if roles and obs.optimizers and not out:
        out.append(f"{' and '.join(roles)}: not told apart among the networks seen")
    return out


def _label(obj) -> str:
    if isinstance(obj, Optimizer):
        return f"{obj.role} optimizer step" if obj.role in ("G", "D") else f"{obj.name} step"
    if isinstance(obj, Call):
        m = obj.model
        if m.role == "G":
            return "G forward"
        if m.role == "D":
            g_step = obj.next_opt is not None and obj.next_opt.role == "G"
            return "D forward (G step)" if g_step else "D forward"
        return f"{m.name} forward"
    return OTHER


def _export_trace(prof, obs: Observations, run: Run) -> str | None:
    """The chrome trace for Perfetto, with the provisional range names replaced by phases."""
    path = Path(run.trace_request) if run.trace_request else default_trace(run.source)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
    for event in trace.get("traceEvents", []):
        name = event.get("name", "")
        if isinstance(name, str) and name.startswith(RANGE):
            event["name"] = _label(obs.ranges.get(int(name[len(RANGE):])))
    atomic_write(path, lambda f: f.write(json.dumps(trace).encode()))  # two runs at once: one whole trace, never half
    return str(path)


def _settings(obs: Observations, sched: Schedule, device: torch.device, facts: MachineFacts) -> dict:
    s: dict = {"device": str(device)}
    n, w = max(sched.profiled, 1), obs.window  # per profiled iteration
    s["conv_linear_outputs"] = {f"{dtype}{' (autocast)' if ac else ''}": c / n for (dtype, ac), c in w.dtypes.items()}
    s["autocast"] = any(ac for _, ac in w.dtypes)
    s["conv_input_formats"] = {k: c / n for k, c in w.formats.items()}
    s["fixed_conv_shapes"] = all(len(v) == 1 for v in obs.conv_shapes.values())
    s["loss_modules"] = dict(obs.losses)
    d = obs.role("D")
    s["d_last_module"] = d.last_module if d else None
    s["d_final_sigmoid"] = d.sigmoid_path if d else None  # the nn.Sigmoid whose output D returns
    s["d_sigmoid_output"] = d.sigmoid_output if d else None  # which of D's outputs, where it returns several
    s["compiled"] = [m.name for m in obs.models.values() if m.compiled]
    s["compiler"] = _compiler(obs.compiler, obs.function_mode)
    s["lightning"] = lightning_settings(obs)
    s["dataloaders"] = [dict(describe_loader(loader), built_at=_at(obs.built_at.get(id(loader))),
                             epoch_start_ms=_median(obs.epoch_starts.get(id(loader))),
                             batches_per_epoch=_length(loader))
                        for loader in obs.loaders]
    g_opt = obs.optimizer_of("G")
    s["d_grads_in_g_step"] = (g_opt.grads_from.get(d, 0) / n) if g_opt and d else 0
    d_opt, g = obs.optimizer_of("D"), obs.role("G")
    s["g_grads_in_d_step"] = (d_opt.grads_from.get(g, 0) / n) if d_opt and g else 0
    s["gradient_penalty"] = described(obs, sched.profiled)
    s["machine_load"] = sched.load.describe() if sched.load else None
    if facts.cuda:
        s["cudnn_benchmark"], s["tf32"], s["gpu"] = facts.cudnn_benchmark, facts.tf32, facts.gpu
    return s


def _compiler(counts: dict, own_mode: bool = False) -> dict | None:
    """What torch.compile did while the doctor watched, as plain values (None where the run did not finish). Where
    the doctor pushed its own torch function mode (`functions`), dynamo guards on the mode stack, and taking the mode
    off fails that guard: those recompiles are the doctor's, not your loop's, and are left out."""
    if not counts:
        return None
    whole, after = counts["whole run"], counts["after warm-up"]
    reasons = [r for r in after.recompile_reasons if not (own_mode and MODE_STACK_GUARD in r)]
    return {"graphs": whole.compiled_graphs, "graph_breaks": whole.graph_breaks,
            "break_reasons": first_lines(whole.break_reasons), "recompiles_after_warmup": len(reasons),
            "iterations_after_warmup": counts["iterations after warm-up"],
            "recompile_reasons": first_lines(reasons)}


def _median(values) -> float | None:
    return round(statistics.median(values), 1) if values else None


def _length(loader) -> int | None:
    """Batches per epoch (None for a dataset without a length)."""
    try:
        return len(loader)
    except TypeError:
        return None
