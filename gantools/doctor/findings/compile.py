"""The doctor's findings about torch.compile in your code, read from `report.settings["compiler"]` (what dynamo
recorded while the doctor watched: `measuring.compile_counts`): graphs compiled again after the warm-up, and graph
breaks. Neither has a model of its gain (a recompile's cost is its compile time, which the run does not separate
from the iteration's), so both say "measure it"; notebook 09 measures both on the tutorial's loop."""
from __future__ import annotations

import re

from ...core.techniques import notebook
from . import names
from .report import DoctorReport, Finding

# dynamo's guard-failure wording (a pattern) -> the change that keeps that guard holding, in your code
RECOMPILE_FIXES = (
    (r"grad_mode", "# sample or evaluate through the module itself, which compiles nothing:\n"
                  "with torch.no_grad():\n    images = {g}._orig_mod(...)  # your sampling call's arguments"),
    (r"\btraining\b", "# keep the compiled module in one mode; evaluate through {g}._orig_mod (the module itself)"),
    (r"size mismatch", "{drop_last}\n# every batch the same size; or compile for changing sizes from the start: "
                      "torch.compile(model, dynamic=True)"),
    (r"== -?\d*\.\d+", "# a Python number that changes is a constant in the graph: pass it as a tensor,\n"
             "# torch.tensor(value, device=...)"),
)
FALLBACK_FIX = "# run your script with TORCH_LOGS=recompiles set: it prints each guard that fails, as it fails"


def _compiler(r: DoctorReport) -> dict:
    return r.settings.get("compiler") or {}


def recompiles(r: DoctorReport, facts) -> Finding | None:
    c = _compiler(r)
    n, iterations = c.get("recompiles_after_warmup", 0), c.get("iterations_after_warmup", 0)
    if not n:
        return None
    reasons = c["recompile_reasons"]
    fixes = [fix.format(g=names.model(r, "G"), drop_last=names.loader_call(r, "drop_last=True"))
             for pattern, fix in RECOMPILE_FIXES if any(re.search(pattern, reason) for reason in reasons)]
    return Finding(
        "recompiles", "torch.compile compiles your models again after the warm-up",
        f"{n} recompile(s) in the {iterations} iterations after the warm-up ({n / iterations:.2f} per iteration); "
        f"the guards that failed: {'; '.join(reasons)}",
        "a compiled graph holds only while its guards hold (input shapes, dtypes and requires_grad, the module's "
        "training flag, the grad mode, Python numbers); each failure runs dynamo, AOTAutograd and inductor again, "
        "seconds each time, and past torch._dynamo.config.recompile_limit versions the function runs uncompiled",
        "\n".join(fixes) or FALLBACK_FIX, notebook("compile"), None)


def graph_breaks(r: DoctorReport, facts) -> Finding | None:
    c = _compiler(r)
    n = c.get("graph_breaks", 0)
    if not n:
        return None
    g, d = names.model(r, "G"), names.model(r, "D")
    return Finding(
        "graph-breaks", "compiled code breaks into several graphs",
        f"{n} graph break(s) while your code was compiled, {c['graphs']} graph(s) in all; dynamo's reasons: "
        f"{'; '.join(c['break_reasons'])}",
        "at a break dynamo ends the graph and Python runs the line it cannot capture (a .item(), a print, a "
        "backward(), an optimizer step): nothing is fused across it, and each piece has guards of its own",
        f"{g}, {d} = torch.compile({g}), torch.compile({d})  # the models, not the whole training step\n"
        "# keep .item(), print and logging out of compiled code; find each break with:\n"
        f"{d} = torch.compile({d}, fullgraph=True)  # the first break is then an error naming its line",
        notebook("compile"), None)


RULES = (recompiles, graph_breaks)
