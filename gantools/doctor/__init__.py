"""`gantools doctor`: your own GAN training loop, measured, and what to change in it.

Three ways in, one `DoctorReport`:

- a script, unmodified: `python -m gantools doctor [--steps N] [--warmup N] [--json PATH] [--trace PATH]
  [--timeout S] SCRIPT.py [ARGS...]` (`run_script`). It runs as `__main__` with `sys.argv = [SCRIPT.py, ARGS...]`,
  its folder first on `sys.path` and the working directory unchanged, and is stopped once the doctor has measured
  (a LightningModule run by Lightning's Trainer too: its fixes are then the Trainer's own arguments, `lightning`);
- a step function and its data: `run(step, data)`;
- your own loop with two marks: `with watch() as doc: for batch in doc.data(loader): ...; doc.end_step()`, then
  `doc.report`.

How it sees a loop it did not write (every hook and patch is removed, and sys.argv/sys.path restored, at the end;
`hooks`):

- **Iterations.** In a script, from optimizer step hooks (`torch.optim.optimizer.register_optimizer_step_*_hook`,
  global): one iteration is the interval between two steps of the optimizer that steps least often, so a WGAN loop
  with five critic steps per generator step is counted in generator iterations. In the other forms, your marks.
- **Models.** Global module forward hooks (`torch.nn.modules.module.register_module_forward_*hook`) with a depth
  counter: each top-level call of a module that has parameters opens a profiler range. G is the model whose output
  is images and feeds another model, D the model fed by G (else the one returning one value per image). D's calls
  are split into D's step and G's step by the optimizer that steps next. Backward time is attributed through the
  autograd sequence number that ties each `evaluate_function: XBackward0` event to the forward op, inside a model's
  range, that created it. Global *full backward* hooks are not used: they wrap every module's outputs and break
  in-place ops (`LeakyReLU(inplace=True)` then raises "a view ... is being modified inplace"). Where no module holds
  an optimizer's parameters, its network is the plain function of yours that computes with them alone (`functions`).
- **Images per iteration.** The batches taken from a DataLoader; without one, the batches of data D was fed (`feeds`);
  where neither can be counted, unknown (None), never 0.
- **Data wait.** Time inside DataLoader iteration (`_BaseDataLoaderIter.__next__`, patched), or inside `doc.data`.
  It is host time only: the batch's copy to the device happens in your code after it.
- **Host syncs.** `Tensor.item`, `tolist`, `__bool__`, `__float__`, `__int__`, `__repr__`, `__format__` and
  `.cpu()` of a device tensor, called from your code (not from torch's), each with its FILE:LINE. On CUDA, while
  profiling, also every other sync your code makes (`.to("cpu")`, boolean masks, GradScaler's reads,
  `torch.cuda.synchronize()`), placed on your line through PyTorch's sync debug mode (`syncs`); the profiler's
  `cuda*Synchronize` calls, gantools' own left out, show whether any was not placed.
- **Settings.** Conv/Linear output dtypes and autocast, conv input memory format, loss ops, D's last module and the
  nn.Sigmoid whose output D returns (of a two-headed D, `validity, label = D(x)`, the one that made one of its
  outputs, seen by the storage they share: `observations`), DataLoader knobs and per-image transforms, optimizer
  implementations, whether D's parameters receive gradients in G's step (post-accumulate-grad hooks), a gradient
  penalty (`torch.autograd.grad` with create_graph on a tensor D was fed, patched: `penalties`), compiled modules,
  cudnn.benchmark, TF32, peak memory.

Measurement (`gantools.measuring.protocol`'s protocol, `schedule`): `warmup` iterations are skipped; then one profiler
warm-up iteration and `steps` iterations under torch.profiler; then two iterations whose every op is counted (the
host budget: launches, syncs, host reads per iteration, `host_count`; not where torch.compile has compiled code) and
`steps` iterations timed, both with nothing installed but the iteration marks (the device synchronised at each timed
one; their median is the step time and images/s reported), so the profiler's overhead (profiled over unprofiled step
time) is stated. The verdict is
`profiling.bottleneck`, the one place that decides it (`analysis`). Every finding rests on numbers from this run and
is ranked by its estimated gain (Amdahl on measured shares), or says "measure it" where no model of its gain exists
(`rules`: one pure function per rule).

Measured, not estimated (`--try`, `try_fixes`): the script is run again with each fix the findings call for applied
at run time (`fixes`: global patches and per-model forward wrappers, undone after each run), each run timed on its
own (`trial`), each fix measured against the best so far with tune's paired-repeat protocol and a loss guard
(`try_fixes`); `--patch` turns the kept fixes into source edits of your files with libcst (`patching`; the logits
edit, which must keep what your code computes, is made whole or listed by hand: `logits`, over `sources`).

Several processes (DistributedDataParallel): `--nproc N`, or the doctor itself under torchrun, runs the diagnosis in
every process; rank 0 gathers the others' and adds what only several processes show (`ranks`, `watching.ddp`,
`findings.ddp`):
the gradient all-reduce's share of a step, accumulation without `no_sync`, a DataLoader without a DistributedSampler,
`find_unused_parameters`, BatchNorm buffers broadcast at every forward.

The stages, each a subpackage, bottom first (a stage imports only itself and those below: tests/test_imports.py):
- `watching`: watching a run: `frames` (which code is yours), `observations` (what the hooks record; G and D told
  apart), `hooks`, `lightning` (Lightning's Trainer running the loop), `feeds` (what fed each model call),
  `functions` (networks written as plain functions), `penalties` (a gradient penalty, seen and timed), `syncs` (the
  device syncs the hooks do not see), `memory`, `host_count` (the ops of a few iterations, counted), `pipeline`
  (the DataLoader's per-image work) and `schedule` (which iteration is watched how).
- `findings`: what is drawn from it: `report` (`DoctorReport`, `Finding`) and the rules (`rules`, with `compile`,
  `memory`, `penalties`, `ddp` and `reads`: reads to batch, reads that feed training; `names`: the
  snippets' words for your script's things).
- `editing`: your source read and edited whole (`sources`, `scopes`, `logits` with `logits_file`), `edit`
  (`Edit`: one fix's edit of one file, made in the patch's single pass), your reads of device values followed to
  where they go (`reads`), your script's names for the snippets (`names`).
- `fixes`: one `Fix` class per change, holding all of it (`fix`), listed in `catalogue` with `Applied`, which
  installs and undoes them; `autocast`, `freeze`, `detach`, `lazy_penalty` and `trainer` hold the fixes with
  machinery of their own (a forward wrapper, a source edit).
- `patching`: the kept fixes as one diff of your files (`patch`).
- `diagnosis`: a run turned into a report: `analysis`, `watch` (the front object, `Watch`), `script` and `ranks`.
- `trying`: `--try`: `trial` (one run of your script with fixes applied) and `try_fixes` (each fix against the best).
"""
from ..errors import DoctorError, ScriptError
from .diagnosis.analysis import OTHER, default_trace
from .watching.hooks import SYNC_METHODS
from .findings.report import DoctorReport, Finding
from .findings.reads import SYNCS_PER_STEP
from .findings.rules import MIN_GAIN, MIN_SHARE, RULES, MachineFacts, findings
from .watching.schedule import PACING_LIMIT, STEPS, WARMUP
from .diagnosis.script import TIMEOUT_S, check_script, run_script
from .trying.try_fixes import TryReport, try_fixes
from .diagnosis.watch import Watch, run, watch

__all__ = ["DoctorError", "DoctorReport", "Finding", "MIN_GAIN", "MIN_SHARE", "MachineFacts", "OTHER", "PACING_LIMIT",
           "RULES", "STEPS", "SYNCS_PER_STEP", "SYNC_METHODS", "ScriptError", "TIMEOUT_S", "TryReport", "WARMUP",
           "Watch", "check_script", "default_trace", "findings", "run", "run_script", "try_fixes", "watch"]
