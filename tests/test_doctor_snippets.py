"""Every change a finding shows "in your code" speaks in the script's own names (issue 50, item 6): for each script
in tests/scripts/ and each rule, a report built here (the rule's firing case from test_doctor_rules.py, with the
script's own lines where the doctor sees them: its DataLoader's line, the line that takes batches, the lines calling
G and D, its `.item()` lines), the script's names read from its source as the analysis reads them
(`editing.names.your_names`), and each name the snippet reads checked against the names the script has. Static: no
script runs."""
import ast
import builtins
import copy
import re
from pathlib import Path

import pytest

from gantools.doctor import RULES
from gantools.doctor.editing.names import your_names
from gantools.doctor.editing.reads import follow_sites
from test_doctor_rules import FIRES, loader

SCRIPTS = Path(__file__).parent / "scripts"
NAMED = {  # script: (G, D, G's optimizer, D's optimizer), as the doctor names them in a run
    "accelerate_dcgan.py": ("netG", "netD", "optimizerG", "optimizerD"),
    "acgan.py": ("generator", "discriminator", "optimizer_G", "optimizer_D"),
    "bce_helper.py": ("G", "D", "opt_g", "opt_d"),
    "began.py": ("generator", "discriminator", "optimizer_G", "optimizer_D"),
    "cgan_mlp.py": ("generator", "discriminator", "optimizer_G", "optimizer_D"),
    "dcgan_adv_layer.py": ("generator", "discriminator", "optimizer_G", "optimizer_D"),
    "dcgan_ddp.py": ("netG", "netD", "optimizerG", "optimizerD"),
    "dcgan_plain.py": ("netG", "netD", "optimizerG", "optimizerD"),
    "dcgan_tutorial.py": ("netG", "netD", "optimizerG", "optimizerD"),
    "faces_folder.py": ("generator", "discriminator", "opt_g", "opt_d"),
    "lightning_gan.py": ("self.generator", "self.discriminator", "opt_g", "opt_d"),
    "r1_dcgan.py": ("G", "D", "opt_g", "opt_d"),
    "sigmoid_in_forward.py": ("G", "D", "opt_g", "opt_d"),
    "trainer_class_dcgan.py": ("self.G", "self.D", "self.opt_g", "self.opt_d"),
    "vanilla_gan_functional.py": ("G", "D", "G_solver", "D_solver"),
    "vanilla_gan_main.py": ("G", "D", "g_opt", "d_opt"),
    "wgan.py": ("generator", "critic", "opt_g", "opt_c"),
    "wgan_gp_mlp.py": ("generator", "discriminator", "optimizer_G", "optimizer_D"),
    "wgan_mlp_next_batch.py": ("G", "D", "G_solver", "D_solver"),
}


def test_every_training_script_is_checked():
    """A new script under tests/scripts/ is named here (or is not a GAN loop with G and D to name)."""
    not_loops = {"glyph_pngs.py", "no_training.py", "raises.py", "vanilla_gan_inline.py"}  # the last: no G or D found
    assert {p.name for p in SCRIPTS.glob("*.py")} - not_loops == set(NAMED)


def script_names(source: str) -> set:
    """Every name the script binds or reads, its imports' and parameters' included."""
    tree = ast.parse(source)
    found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    found |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    found |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    found |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    return found


def foreign(snippet: str, names: set) -> set:
    """The names a snippet reads that neither the script nor the snippet itself binds (nor Python's builtins)."""
    tree = ast.parse(snippet)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound - names - set(dir(builtins))


def lines_matching(source: str, pattern: str) -> list:
    return [i for i, line in enumerate(source.splitlines(), 1) if re.search(pattern, line)]


def as_seen(path: Path):
    """For each rule, its firing report with this script's names and lines where a run of it would give them."""
    source, where = path.read_text(), str(path.resolve())
    g, d, opt_g, opt_d = NAMED[path.name]
    calls = {role: [[where, n] for n in lines_matching(source, rf"(?<![\w.]){re.escape(name)}\(")
                    if not re.match(r"\s*(def|class) ", source.splitlines()[n - 1])]
             for role, name in (("G", g), ("D", d))}
    models = {"G": {"name": g, "call_sites": calls["G"]},
              "D": {"name": d, "call_sites": calls["D"], "steps_after_call": [[*at, "G", 1] for at in calls["D"][-1:]]}}
    built, loops = lines_matching(source, r"DataLoader\("), lines_matching(source, r"^\s*for .* in .*loader")
    sites = [{"where": f"{where}:{n}", "code": source.splitlines()[n - 1].strip(), "method": "item", "per_step": 1.0}
             for n in lines_matching(source, r"\.item\(\)")]
    follow_sites(sites)
    loaders = [dict(loader(num_workers=2), built_at=[where, built[0]] if built else None)]
    seen = copy.deepcopy(FIRES["host-sync"][0])
    seen.models, seen.settings = models, {"dataloaders": loaders, "data_site": f"{where}:{loops[0]}" if loops else None}
    names = your_names(seen)  # read once per script: the same for every rule
    for kind, (fired, facts) in FIRES.items():
        r = copy.deepcopy(fired)
        r.source, r.models = where, models
        for role, o in r.optimizers.items():
            o["name"] = {"G": opt_g, "D": opt_d}[o.get("role") or role]
        for x in r.settings["dataloaders"]:
            x["built_at"] = loaders[0]["built_at"]
        r.settings.update(data_site=seen.settings["data_site"], names=names)
        if kind in ("host-sync", "read-feeds-training"):
            r.sync_sites, r.host_syncs_per_step = sites, float(len(sites))
        yield kind, r, facts


@pytest.mark.parametrize("script", sorted(NAMED))
def test_each_change_shown_names_only_what_the_script_has(script):
    path = SCRIPTS / script
    names = script_names(path.read_text())
    shown = 0
    rules = {rule.__name__.replace("_", "-"): rule for rule in RULES}
    for kind, r, facts in as_seen(path):
        finding = rules[kind](r, facts)
        if finding is None:
            continue
        shown += 1
        assert not foreign(finding.change, names), (kind, foreign(finding.change, names), finding.change)
    assert shown >= len(RULES) - 2  # the two read findings fire only where the script reads values so


def test_the_data_loading_fix_uses_the_scripts_loader_batch_device_and_its_own_workers_flag():
    """The issue's case: PyTorch-GAN's script has its own DataLoader line and an `--n_cpu` flag it never passes to it;
    the snippet said `dataset`, `device`, `batch_size` and `real`, none of which the script has."""
    reports = {kind: (r, facts) for kind, r, facts in as_seen(SCRIPTS / "began.py")}
    rules = {rule.__name__.replace("_", "-"): rule for rule in RULES}
    decoded = rules["per-sample-transforms"](*reports["per-sample-transforms"]).change
    assert 'for x, _ in dataloader.dataset]).to("cuda" if cuda else "cpu")' in decoded  # its own device choice
    assert 'idx = torch.randint(len(images), (dataloader.batch_size,), device="cuda" if cuda else "cpu")' in decoded
    (loop,) = lines_matching((SCRIPTS / "began.py").read_text(), r"for i, \(imgs, _\) in enumerate\(dataloader\)")
    assert f"imgs = images[idx].float().div_(127.5).sub_(1)  # your line {SCRIPTS / 'began.py'}:{loop}" in decoded
    workers = rules["no-workers"](*reports["no-workers"]).change
    (built,) = lines_matching((SCRIPTS / "began.py").read_text(), r"DataLoader\(")
    assert workers.startswith("dataloader = torch.utils.data.DataLoader(..., num_workers=opt.n_cpu, "
                              "persistent_workers=True)  # your line ") and f"began.py:{built}: keep" in workers
    assert workers.endswith("keep its other arguments; your flag, which the DataLoader never read: run with --n_cpu 2")
    cgan = {kind: (r, facts) for kind, r, facts in as_seen(SCRIPTS / "cgan_mlp.py")}  # passes num_workers=opt.n_cpu
    assert rules["no-workers"](*cgan["no-workers"]).change.endswith("; your flag: run with --n_cpu 2")
