"""The workbook as a tutorial, read statically: each of 01-04 and 07 shows its technique as the PyTorch lines a
reader adds and races them in the same kernel, offers a try-it widget, reads nothing measured in another kernel, and
every notebook ends with exercises; the stored copies hold one real run each, top to bottom, and stay small."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))

# the lines each technique adds to a plain loop: each pattern in a code cell that marks its added lines `# new`
TECHNIQUE_LINES = {
    "01_profiling.ipynb": [r"torch\.profiler\.profile\(", r"record_function\(", r"key_averages\(\)"],
    "02_mixed_precision.ipynb": [r"torch\.autocast\(", r"GradScaler\(", r"\.scale\("],
    "03_data_loading.ipynb": [r"DataLoader\(", r"num_workers=", r"pin_memory=", r"non_blocking=True"],
    "04_optimizers_and_accumulation.ipynb": [r"fused=True", r"AdamW\(", r"LambdaLR\("],
    "07_gan_variants.ipynb": [r"autograd\.grad\(", r"create_graph=True", r"chunk\(n_critic\)"],
    "08_memory.ipynb": [r"checkpoint\(block, x, use_reentrant=False\)", r"torch\.no_grad\(\)", r"torch\.autocast\("],
    "09_compiler.ipynb": [r"torch\.compile\(gan\.G\)", r"torch\.compile\(gan\.D\)", r"cudagraph_mark_step_begin\(\)"],
    "10_several_gpus.ipynb": [r"init_process_group\(", r"DDP\(gan\.D, .*broadcast_buffers", r"\.chunk\(world\)\[rank\]",
                              r"\.no_sync\(\)", r"if rank == 0:"],
    "11_modern_gan.ipynb": [r"F\.softplus\(fake_scores - real_scores\)", r"autograd\.grad\(",
                                   r"create_graph=True", r"requires_grad_\(penalise\)", r"% every == 0"],
}
# 01's technique is the profiler, which has no speed of its own: its fix is trained in turns with the trainer, and
# its agreement is the plain loop's profile telling the same story as gantools' (time shares)
MEASURED = {"01_profiling.ipynb": (r"\btrain_side_by_side\(", r"\bsame_story\("),
            # 10's loops run in several processes: the kernel launches them, and every rank races in lockstep
            "10_several_gpus.ipynb": (r"\brace_across_ranks\(", r"\bagreement\(")}
TRY_IT = {"01_profiling.ipynb": r"ProfilePanel\(", "02_mixed_precision.ipynb": r"ControlPanel\(",
          "03_data_loading.ipynb": r"ControlPanel\(", "04_optimizers_and_accumulation.ipynb": r"ControlPanel\(",
          "07_gan_variants.ipynb": r"ControlPanel\(", "08_memory.ipynb": r"ControlPanel\(",
          "09_compiler.ipynb": r"ControlPanel\(", "11_modern_gan.ipynb": r"ControlPanel\(",
          "10_several_gpus.ipynb": r"ScalingPanel\("}  # a kernel is one process: the scaling bench instead


def cells(name: str, kind: str) -> list[str]:
    nb = json.loads((NOTEBOOKS / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def test_the_workbook_is_numbered_from_00_without_gaps():
    assert [name[:2] for name in ALL] == [f"{i:02d}" for i in range(len(ALL))] and len(ALL) >= 9


@pytest.mark.parametrize("name", sorted(TECHNIQUE_LINES))
def test_the_technique_is_shown_as_the_lines_a_reader_adds_and_raced(name):
    code = cells(name, "code")
    marked = [c for c in code if "# new" in c]  # the cells that show a reader's added lines, marked `# new`
    missing = [p for p in TECHNIQUE_LINES[name] if not any(re.search(p, c) for c in marked)]
    assert not missing, f"{name}: no cell of lines marked '# new' holds {missing}"
    raced, agreed = MEASURED.get(name, (r"\brace\(", r"\bagreement\("))
    assert any(re.search(raced, c) for c in code), f"{name}: the change is never timed side by side with its start"
    assert any(re.search(agreed, c) for c in code), f"{name}: the plain lines and gantools' version never compared"


@pytest.mark.parametrize("name", sorted(TRY_IT))
def test_each_technique_has_a_try_it_widget(name):
    assert any(re.search(TRY_IT[name], c) for c in cells(name, "code")), f"{name}: no try-it widget"


@pytest.mark.parametrize("name", ALL)
def test_no_notebook_reads_numbers_from_another_kernel(name):
    for c in cells(name, "code"):
        assert not re.search(r"\bbaseline\(\)|load_results\(", c), f"{name} reads another kernel's result:\n{c}"


@pytest.mark.parametrize("name", ALL)
def test_every_notebook_ends_with_exercises(name):
    md = cells(name, "markdown")
    assert any(m.lstrip().startswith("## Exercises") for m in md[-2:]), f"{name}: no '## Exercises' at the end"


@pytest.mark.parametrize("name", ALL)
def test_markdown_states_no_measured_ratio(name):
    """Measured ratios belong in outputs, computed; markdown that types one goes stale on the next machine."""
    for m in cells(name, "markdown"):
        assert not re.search(r"\b\d+\.\d+x\b", m), f"{name}: a typed ratio in markdown:\n{m}"


@pytest.mark.parametrize("name", ALL)
def test_stored_outputs_are_one_real_run_top_to_bottom(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{name}: cells not run once, in order: {counts}"
    text = json.dumps([c["outputs"] for c in code])
    assert "real mode" in text and "quick mode (tiny runs" not in text, f"{name}: stored outputs are not a real run"
    size = (NOTEBOOKS / name).stat().st_size
    assert size < 2_000_000, f"{name} is {size / 1e6:.1f} MB: store it smaller"


def test_06_measures_the_doctors_fixes_on_its_loop_as_a_script_and_shows_the_patch():
    """06 writes its loop as a script, runs `gantools doctor --try --patch` on it, shows the diff, sets the doctor's
    estimates against what --try measured, and times the patched script against the original; its stored run shows
    the --try report and the patch."""
    name = "06_your_own_gan.ipynb"
    code = cells(name, "code")
    assert any(c.startswith("%%writefile") for c in code), f"{name}: its loop is never written as a script"
    assert any('"--try"' in c and '"--patch"' in c for c in code), f"{name}: doctor --try --patch is never run"
    assert any(re.search(r"\bestimate_held\(", c) for c in code), f"{name}: no estimate set against --try's figure"
    assert any('"patch", "-p1"' in c for c in code), f"{name}: the patch is never applied and timed"
    nb = json.loads((NOTEBOOKS / name).read_text())
    shown = json.dumps([c["outputs"] for c in nb["cells"] if c["cell_type"] == "code"])
    assert "gantools doctor --try:" in shown, f"{name}: the stored run shows no --try report"
    assert "+++ b/your_gan.py" in shown or "--try kept no fix" in shown, f"{name}: the stored run shows no patch"


@pytest.mark.parametrize("name", ALL)
def test_every_notebook_ends_with_exercises_then_what_to_remember(name):
    """The exercises, then the rules a learner carries into their own loop, each with this run's number: the last
    cell computes them (`remember.what_to_remember`), and the stored run shows them."""
    nb = json.loads((NOTEBOOKS / name).read_text())
    *_, exercises, last = nb["cells"]
    assert exercises["cell_type"] == "markdown" and "".join(exercises["source"]).lstrip().startswith("## Exercises")
    assert last["cell_type"] == "code" and "what_to_remember(" in "".join(last["source"])
    shown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in last["outputs"])
    assert shown.startswith("## What to remember") and shown.count("\n1. ") == 1, f"{name}: not shown as stored"
