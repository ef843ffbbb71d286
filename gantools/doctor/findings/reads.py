"""The doctor's findings about your code's reads of device values and its other waits for the device: the reads
only shown (printed, logged) to batch (`host_sync`), and the reads whose value feeds training (`read_feeds_training`:
`editing.reads` followed each in your source), never batched. Pure functions over the report, as every rule."""
from __future__ import annotations

import re

from ...core.techniques import YOUR_OWN_GAN
from ...measuring.protocol import amdahl
from ..watching.syncs import NOT_LOCATED, SYNC_OP
from .report import MIN_GAIN, READ_METHODS, DoctorReport, Finding, describe_site

SYNCS_PER_STEP = 1.0    # reading values at least once per iteration, on average, is a per-step sync
YOUR_LOOP = YOUR_OWN_GAN.removesuffix(".ipynb")  # findings about how a hand-written loop is written


def _sync_cost(r: DoctorReport, facts) -> tuple:
    """(estimated gain or None, what the reads cost, in words): on a GPU, the idle share the reads leave."""
    step, sync_ms = r.step_time_ms, r.phases_ms.get("host sync", 0.0)
    if not facts.cuda:
        return None, (f"on this CPU they cost {sync_ms:.2f} ms (no device to wait for); on a GPU each one waits for "
                      "all queued work")
    idle = 1 - r.device_busy_ms / step
    gain = amdahl(step, step - r.device_busy_ms) if idle > 0.1 else amdahl(step, sync_ms)
    return (gain if gain >= MIN_GAIN else None), f"the GPU sits idle {100 * idle:.0f}% of the iteration"


def host_sync(r: DoctorReport, facts) -> Finding | None:
    """The reads only shown (printed, logged) and the other waits: to batch. A read whose value feeds training is
    `read_feeds_training`'s, never batched."""
    shown_sites = [x for x in r.sync_sites if not x.get("feeds")]
    count = r.host_syncs_per_step - sum(x["per_step"] for x in r.sync_sites if x.get("feeds"))
    if count < SYNCS_PER_STEP:
        return None
    sites = "; ".join(describe_site(x) for x in shown_sites[:5])
    gain, cost = _sync_cost(r, facts)
    reads_only = all(x["method"] in READ_METHODS for x in shown_sites)
    title = (f"your code reads values from the device {count:g} times per iteration" if reads_only
             else f"your code waits for the device {count:g} times per iteration")
    return Finding(
        "host-sync", title, f"{sites}; {cost}",
        ("every read (.item(), .tolist(), printing or comparing a tensor)" if reads_only else
         "every read (.item(), .tolist(), printing or comparing a tensor, .to('cpu'), a boolean mask's size) and "
         "every explicit synchronize")
        + " makes the host wait until the device has finished all queued work; meanwhile no new kernels are "
        "queued, so the GPU idles between steps",
        _keep_on_device(shown_sites)
        + "".join(f"\n{_WAITS[m]}" for m in dict.fromkeys(x["method"] for x in shown_sites) if m in _WAITS),
        YOUR_LOOP, gain)


def read_feeds_training(r: DoctorReport, facts) -> Finding | None:
    """Reads whose value the loop computes with (`editing.reads` followed each in your source): batching them would
    change the training, so the change keeps each value on the device instead."""
    feeding = [x for x in r.sync_sites if x.get("feeds")]
    count = sum(x["per_step"] for x in feeding)
    if count < SYNCS_PER_STEP:
        return None
    gain, cost = _sync_cost(r, facts)
    if not facts.cuda:
        cost = "on this CPU nothing waits for them; on a GPU each one waits for all queued work"
    seen = "; ".join(f"{describe_site(x)}: its value {x['feeds']['how']}" for x in feeding[:5])
    title = ("a value your code reads from the device feeds its training" if len(feeding) == 1 else
             f"{len(feeding)} values your code reads from the device feed its training")
    return Finding(
        "read-feeds-training", f"{title}, read {'once' if count == 1 else f'{count:g} times'} per iteration",
        f"{seen}; {cost}",
        "each read waits for the device, as a printed value's does, but this value is used by what the loop computes "
        "next (a loss, an optimizer, a branch): read less often, as logged values can be, it would change the "
        "training. Kept on the device as a tensor, the computation is the same and nothing waits for it",
        "\n".join(_on_device(x) for x in feeding[:5]), YOUR_LOOP, gain)


def _on_device(site: dict) -> str:
    """One feeding read's change: its statement rewritten to keep the value a tensor, or why it stays a read."""
    lines = site["feeds"].get("lines") or [int(site["where"].rsplit(":", 1)[-1])]
    where = f"your line{'s' if len(lines) > 1 else ''} {'-'.join(str(n) for n in lines)}"
    rewrite = site["feeds"].get("rewrite")
    if rewrite:
        target = rewrite.split(" = ", 1)[0]
        return (f"# {where}: the value stays a tensor on the device (.detach(): no gradient through it)\n"
                f"{rewrite}\n# {target} is a tensor from here on: where your code prints it, that read is a "
                "logged one (host-sync)")
    return (f"# {where} (`{site['code']}`): its value {site['feeds']['how']}, on the host: the read stays, or the "
            "choice becomes a tensor op (torch.where) computed on the device")


_CHAIN = re.compile(r"[A-Za-z_][\w.]*(?:\(\))?")


def _keep_on_device(sites: list) -> str:
    """The snippet in your names: the values your lines read with .item(), stacked on the device and read every N
    iterations."""
    values = list(dict.fromkeys(v for x in sites if x["method"] == "item"
                                for v in (x.get("reads") or _READ.findall(x["code"] or ""))))
    lines = sorted({x["where"].rsplit(":", 1)[-1] for x in sites if x["method"] == "item"}, key=int)
    stacked = (", ".join(f"{v if _CHAIN.fullmatch(v) else f'({v})'}.detach()" for v in values[:6]) if values
               else "...")  # the values those lines read: each one's tensor, .detach()'d
    where = f" (your lines {', '.join(lines[:6])})" if lines else ""
    return ("# keep the numbers on the device, read them once every N iterations\n"
            "stats = []  # before the loop\n"
            f"stats.append(torch.stack([{stacked}]))  # instead of .item(){where}\n"
            "if len(stats) == 50:\n"
            "    print(torch.stack(stats).mean(0).tolist()); stats.clear()  # one sync per 50 iterations")


_READ = re.compile(r"([A-Za-z_]\w*(?:\[[^\]]*\])?(?:\.[A-Za-z_]\w*(?:\(\))?)*)\.item\(\)")


# What removes each kind of wait the sync watch and the profiler find beside value reads (`syncs`)
_WAITS = {
    "GradScaler.step": "# GradScaler.step reads found_inf (one sync per optimizer step): on an Ampere or newer GPU,\n"
                       "# torch.autocast(device.type, dtype=torch.bfloat16) needs no GradScaler",
    "torch.cuda.synchronize": "# torch.cuda.synchronize() in the loop: remove it (time with the profiler, or CUDA "
                              "events read after the loop)",
    SYNC_OP: "# a boolean mask or nonzero (x[mask]) reads the result's size: torch.where(mask, x, 0) keeps the shape;\n"
             "# .to('cpu') of a value: keep it on the device and read it every N iterations, as above",
    NOT_LOCATED: "# the profiler saw more waits than it could place (torch.cuda.Event.synchronize, a library's own "
                 "sync): look for them around the sites above",
}
