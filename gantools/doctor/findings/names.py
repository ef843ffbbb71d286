"""The snippets' words for your script's things, from `report.settings["names"]` (what `editing.names` read in your
source) and the names the doctor saw (G, D, their optimizers): every rule writes its change with these, so a snippet
names what your script names, or says which of your lines to change. Where a fact was not found (a notebook cell, a
loader built elsewhere), the generic word stays."""
from __future__ import annotations

from .report import DoctorReport


def yours(r: DoctorReport) -> dict:
    return r.settings.get("names") or {}


def model(r: DoctorReport, role: str) -> str:
    """How your code names G or D (the tutorial's netG/netD where not seen)."""
    return r.models.get(role, {}).get("name", f"net{role}")


def device(r: DoctorReport) -> str:
    """The device your snippets name: your own device choice, else where D's weights are (true on any device your
    script picks)."""
    return yours(r).get("device") or f"next({model(r, 'D')}.parameters()).device"


def device_type(r: DoctorReport) -> str:
    """The device type for `torch.autocast`, from your script's own device choice, else D's weights' (never the
    machine the doctor ran on)."""
    return yours(r).get("device_type") or f"next({model(r, 'D')}.parameters()).device.type"


def loader_call(r: DoctorReport, arguments: str, note: str = "") -> str:
    """Your DataLoader's line with `arguments` added: `dataloader = torch.utils.data.DataLoader(..., num_workers=2)
    # your line train.py:57: keep its other arguments`, and `note` after it."""
    n = yours(r)
    if "loader_line" not in n:
        return f"# your DataLoader(..., {arguments}){note}"
    head = f"{n['loader']} = " if n.get("loader") else ""
    return (f"{head}torch.utils.data.DataLoader(..., {arguments})  # your line {n['loader_line']}: keep its other "
            f"arguments{note}")


def with_workers(r: DoctorReport, n: int, rest: str) -> str:
    """Your DataLoader's line with `n` workers (by your own flag, where you have one) and `rest`."""
    arguments, note = workers(r, n)
    return loader_call(r, f"{arguments}, {rest}", note)


def workers(r: DoctorReport, n: int) -> tuple:
    """(`num_workers=...` in your terms, a comment): your own flag for workers where your script has one
    (`num_workers=opt.n_cpu`, run with `--n_cpu 2`; said when the DataLoader never read it), else the number."""
    flag = yours(r).get("workers_flag")
    if not flag:
        return f"num_workers={n}", ""
    unread = "your flag, which the DataLoader never read: " if not flag["used"] else "your flag: "
    return f"num_workers={flag['read_as']}", f"; {unread}run with {flag['flag']} {n}"


def loader_parts(r: DoctorReport) -> tuple:
    """(your DataLoader's dataset, its batch size, lines that bind them first where your script has no name for
    them): `dataloader.dataset`, `dataloader.batch_size`, ""; else `dataset`, `batch_size` bound to `...` with the
    line of yours they stand for."""
    n = yours(r)
    if n.get("loader"):
        return f"{n['loader']}.dataset", f"{n['loader']}.batch_size", ""
    at = f" at your line {n['loader_line']}" if n.get("loader_line") else ""
    return "dataset", "batch_size", (f"dataset = ...  # the dataset your DataLoader{at} reads\n"
                                     f"batch_size = ...  # its batch size\n")


def images(r: DoctorReport) -> tuple:
    """(the name to bind a batch's images to, a comment saying where your loop takes them): `imgs` of `for i, (imgs,
    _) in enumerate(dataloader)`; `real` for a loop that indexes its batch (`data[0]`) or was not read."""
    n, site = yours(r), r.settings.get("data_site")
    where = f"  # your line {site}" if site else ""
    if n.get("batch") and n.get("batch_is_tuple"):
        return n["batch"], where
    if n.get("batch"):
        return "real", f"  # your {n['batch']}[0]" + (f", line {site}" if site else "")
    return "real", where


def call_lines(r: DoctorReport, *roles: str) -> list:
    """Your lines that call the models of `roles`, [FILE:LINE, code], in order, each once."""
    calls = yours(r).get("calls", {})
    seen = {where: code for role in roles for where, code in calls.get(role, [])}
    return sorted(seen.items(), key=lambda kv: (kv[0].rsplit(":", 1)[0], int(kv[0].rsplit(":", 1)[1])))


def line_numbers(lines: list) -> str:
    return ", ".join(where.rsplit(":", 1)[1] for where, _ in lines)
