"""A value your code reads from the device, followed in your source (`editing.reads`): only shown (printed, logged,
kept in a history) or fed back into training (a loss, an optimizer's setting, a branch). The host-sync finding batches
only the first; a read that feeds training is its own finding, with the rewrite that keeps the value on the device.
Static: each test reads a source string or a script of tests/scripts/, or hands the rules a report built here."""
from pathlib import Path

from gantools.doctor.editing.reads import follow_sites, reads_at
from gantools.doctor.findings import rules
from test_doctor_rules import CPU, report

BEGAN = Path(__file__).parent / "scripts" / "began.py"


def line_of(source: str, code: str) -> int:
    (line,) = [i for i, text in enumerate(source.splitlines(), 1) if text.strip() == code]
    return line


def test_began_control_variable_feeds_d_loss_and_its_rewrite_keeps_it_on_the_device():
    """PyTorch-GAN's BEGAN: `k` from `diff.item()`, clamped by min/max, weights D's loss on the fakes; `M` is only
    printed."""
    source = BEGAN.read_text()
    update = line_of(source, "k = k + lambda_k * diff.item()")
    (k,) = reads_at(source, update, "item")
    assert k.feeds and k.value == "diff"
    assert k.how == (f"reaches `d_loss.backward()` at line {line_of(source, 'd_loss.backward()')} "
                     "(through `k`, `d_loss`)")
    assert k.rewrite == "k = (k + lambda_k * diff.detach()).clamp(0, 1)" and k.lines == (update, update + 1)
    (m,) = reads_at(source, line_of(source, "M = (d_loss_real + torch.abs(diff)).item()"), "item")
    assert not m.feeds and m.value == "d_loss_real + torch.abs(diff)" and m.rewrite == ""
    printed = line_of(source, "% (epoch, opt.n_epochs, i, len(dataloader), d_loss.item(), g_loss.item(), M, k)")
    assert [(x.value, x.feeds) for x in reads_at(source, printed, "item")] == [("d_loss", False), ("g_loss", False)]


LOOP = '''
for step, x in enumerate(loader):
    loss = model(x)
    if loss.item() > 3:
        continue
    lr = base * decay.item()
    for g in opt.param_groups:
        g["lr"] = lr
    s = loss.item()
    sched.step(s)
    d_x, d_g = p_real.item(), p_fake.item()
    history.append(d_x)
    w = w + d_g * loss
    w.backward()
    t = float(loss)
    writer.add_scalar("loss", t, step)
    p_real = p_real.mean()
    logs = {"p": p_real}
'''


def test_a_branch_an_optimizer_setting_and_a_scheduler_feed_training_a_log_does_not():
    def read(code, method="item"):
        return {x.value: x for x in reads_at(LOOP, line_of(LOOP, code), method)}

    assert read("if loss.item() > 3:")["loss"].how == "decides the `if` at line 4"
    assert read("lr = base * decay.item()")["decay"].how == 'sets `g["lr"]` at line 8 (through `lr`)'
    assert read("s = loss.item()")["loss"].how == "passed to `sched.step(...)` at line 10 (through `s`)"
    unpacked = read("d_x, d_g = p_real.item(), p_fake.item()")  # each value to its own name
    assert not unpacked["p_real"].feeds and unpacked["p_fake"].feeds
    assert unpacked["p_fake"].rewrite == ""  # a tuple assignment: no one-line rewrite offered
    assert not read("t = float(loss)", "float")["loss"].feeds
    assert all(not x.rewrite for x in read("s = loss.item()").values())  # a scheduler reads a number: no rewrite


def test_a_value_rebound_before_its_next_use_and_a_returned_read_are_followed_to_where_they_land():
    """The tutorial script's D(x) is a tensor again when the no-.item() branch stacks it; a trainer class's step
    returns its losses' .item() to a print."""
    tutorial = (BEGAN.parent / "dcgan_tutorial.py").read_text()
    found = reads_at(tutorial, line_of(tutorial, "D_x, D_G_z1, D_G_z2 = D_x.item(), D_G_z1.item(), D_G_z2.item()"),
                     "item")
    assert [x.feeds for x in found] == [False] * 3
    trainer = (BEGAN.parent / "trainer_class_dcgan.py").read_text()
    assert not any(x.feeds for x in reads_at(trainer, line_of(trainer, "return loss_d.item(), loss_g.item()"), "item"))


def test_sites_are_followed_in_their_files_and_a_notebook_cell_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(BEGAN.parent.parent.parent)
    source = BEGAN.read_text()
    update = line_of(source, "k = k + lambda_k * diff.item()")
    sites = [{"where": f"tests/scripts/began.py:{update}", "code": "k = k + lambda_k * diff.item()",
              "method": "item", "per_step": 1.0},
             {"where": "In[3]:33", "code": "losses.append(errD.item())", "method": "item", "per_step": 1.0}]
    follow_sites(sites)
    assert sites[0]["feeds"]["rewrite"] == "k = (k + lambda_k * diff.detach()).clamp(0, 1)"
    assert sites[0]["feeds"]["lines"] == [update, update + 1] and sites[0]["reads"] == []
    assert "feeds" not in sites[1]


def began_sites() -> list:
    """The BEGAN script's three read sites, as the analysis leaves them (followed)."""
    return [{"where": "began.py:209", "code": "% (epoch, opt.n_epochs, i, len(dataloader), d_loss.item(), "
             "g_loss.item(), M, k)", "method": "item", "per_step": 2.0, "reads": ["d_loss", "g_loss"], "feeds": None},
            {"where": "began.py:197", "code": "k = k + lambda_k * diff.item()", "method": "item", "per_step": 1.0,
             "reads": [], "feeds": {"how": "reaches `d_loss.backward()` at line 187 (through `k`, `d_loss`)",
                                    "rewrite": "k = (k + lambda_k * diff.detach()).clamp(0, 1)", "lines": [197, 198]}},
            {"where": "began.py:201", "code": "M = (d_loss_real + torch.abs(diff)).item()", "method": "item",
             "per_step": 1.0, "reads": ["d_loss_real + torch.abs(diff)"], "feeds": None}]


def test_a_read_that_feeds_training_is_its_own_finding_and_never_offered_for_batching():
    r = report(host_syncs_per_step=4.0, sync_sites=began_sites())
    batched = rules.host_sync(r, CPU)
    assert batched.title == "your code reads values from the device 3 times per iteration"
    assert "began.py:197" not in batched.seen and "197" not in batched.change
    assert ("stats.append(torch.stack([d_loss.detach(), g_loss.detach(), (d_loss_real + torch.abs(diff)).detach()]))"
            "  # instead of .item() (your lines 201, 209)") in batched.change
    fed = rules.read_feeds_training(r, CPU)
    assert fed.kind == "read-feeds-training" and fed.estimated_speedup is None
    assert ("began.py:197 `k = k + lambda_k * diff.item()` (item, 1/it): its value reaches `d_loss.backward()`"
            in fed.seen)
    assert fed.title == "a value your code reads from the device feeds its training, read once per iteration"
    assert fed.change.splitlines()[:2] == [
        "# your lines 197-198: the value stays a tensor on the device (.detach(): no gradient through it)",
        "k = (k + lambda_k * diff.detach()).clamp(0, 1)"]
    only_feeding = report(host_syncs_per_step=1.0, sync_sites=began_sites()[1:2])
    assert rules.host_sync(only_feeding, CPU) is None and rules.read_feeds_training(only_feeding, CPU) is not None


def test_a_branch_on_a_device_value_says_the_read_stays_or_becomes_a_tensor_op():
    site = {"where": "train.py:50", "code": "if loss.item() > 3:", "method": "item", "per_step": 1.0, "reads": [],
            "feeds": {"how": "decides the `if` at line 50", "rewrite": "", "lines": []}}
    fed = rules.read_feeds_training(report(host_syncs_per_step=1.0, sync_sites=[site]), CPU)
    assert fed.change == ("# your line 50 (`if loss.item() > 3:`): its value decides the `if` at line 50, on the host: "
                          "the read stays, or the choice becomes a tensor op (torch.where) computed on the device")
