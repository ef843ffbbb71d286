"""What `make gpu-evidence` writes and the docs read back: the report of a run, and its headline for the README and
docs/results.md (`python gpu/evidence.py --headline docs/gpu/RUN`), both drawn from the run's evidence.json alone."""
from __future__ import annotations

import re

REPORT, EVIDENCE, LOG = "report.md", "evidence.json", "log.txt"
SHOWN_ROWS = 4  # a headline names the check rows that passed up to this many; beyond, the report names them


def device_name(evidence: dict) -> str:
    info = (evidence.get("machine") or {}).get("info") or {}
    return info.get("device_name") or "unknown device"


def folder_name(evidence: dict) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name(evidence).lower()).strip("-")[:40] or "unknown-device"
    return f"{slug}{'-dry' if evidence['dry'] else ''}-{evidence['date']}"


def _part(evidence: dict, name: str) -> dict | None:
    return next((p for p in evidence["parts"] if p["name"] == name), None)


def headline(evidence: dict) -> dict:
    """What the README and docs/results.md show of a stored run: the device and date, the ladder's best against the
    reference, the max-throughput row's MFU (against the published bf16 peak and the bf16 matmul measured there),
    the climbing ladder's best and CUDA graph replay against eager where the run has them, FID where measured, and
    every check row."""
    ladder = (_part(evidence, "ladder") or {}).get("result") or {}
    rows = ladder.get("rows") or []
    out = {"device": device_name(evidence), "date": evidence["date"], "dry": evidence["dry"], "ladder": None,
           "climb": _climb(ladder), "graphs": (_part(evidence, "graphs") or {}).get("result"), "check": [],
           "quality": None}
    if rows:
        ref, best = rows[0], max(rows, key=lambda r: r["speedup"])
        top = next((r for r in rows if r["variant"].startswith("max throughput")), best)
        half = next((k for k in ladder.get("measured_matmul_flops", {}) if k != "fp32"), None)
        measured = ladder["measured_matmul_flops"].get(half) if half else None
        out["ladder"] = {
            "reference_images_per_sec": ref["images_per_sec"], "best": best["variant"],
            "best_images_per_sec": best["images_per_sec"], "best_speedup": best["speedup"],
            "top": top["variant"], "top_tflops": top["tflops"], "top_mfu": top.get("mfu"),
            "gflop_per_image": top["flops_per_image"] / 1e9,
            "matmul_precision": half, "matmul_tflops": measured / 1e12 if measured else None,
            "top_of_matmul": top["tflops"] * 1e12 / measured if measured else None}
    rows = [r for name in ("check", "check-autotune") for r in ((_part(evidence, name) or {}).get("result") or {})
            .get("rows", [])]
    out["check"] = [{"row": r["technique"], "ok": r["ok"], "reason": r["reason"]} for r in rows]
    quality = (_part(evidence, "quality") or {}).get("result") or {}
    scored = [r for r in quality.get("rows", []) if "fid" in r]
    if len(scored) >= 2:
        out["quality"] = {"images": scored[0]["images_trained"], "reference_fid": scored[0]["fid"],
                          "variant": scored[-1]["variant"], "fid": scored[-1]["fid"]}
    return out


def _climb(ladder: dict) -> dict | None:
    """The climb's best ('all together': its last kept config) and the reference it climbed from, with their host
    budgets; None for a run without a climb."""
    climb = ladder.get("climb") or {}
    best = climb.get("best")
    if not best or best.get("images_per_sec") is None:
        return None
    ref = climb["rows"][0]
    return {"best_images_per_sec": best["images_per_sec"], "kept_at": best["from"],
            "kept": [r["variant"] for r in climb["rows"][1:] if r["kept"]],
            "reference_images_per_sec": ref["images_per_sec"], "best_host_budget": best.get("host_budget"),
            "reference_host_budget": ref.get("host_budget")}


def _climb_lines(climb: dict) -> list[str]:
    lines = [f"| climbing ladder's best (all together: {', '.join(climb['kept']) or 'nothing kept'}) images/s | "
             f"{climb['best_images_per_sec']:.0f} |"]
    ref, best = climb["reference_host_budget"], climb["best_host_budget"]
    if ref and best:
        lines.append(f"| launches, syncs per iteration: reference / climbing best | {ref['launches']:g}, "
                     f"{ref['syncs']:g} / {best['launches']:g}, {best['syncs']:g} |")
    return lines


def _graphs_line(graphs: dict) -> str:
    if "matches" in graphs:
        return (f"CUDA graph replay against eager over {graphs['steps']} seeded steps: "
                f"{'matches' if graphs['matches'] else 'DOES NOT MATCH'} (largest loss difference "
                f"{graphs['max_loss_diff']:.2e}, largest relative weight difference "
                f"{graphs['max_weight_rel_diff']:.2e}).")
    if "refused" in graphs:
        return f"CUDA graphs (cuda_graphs=True) refused: {graphs['refused']}."
    return f"CUDA graph replay: {graphs.get('result', 'no result')} ({graphs.get('why', '')})."


def headline_markdown(evidence: dict, source: str) -> str:
    """The headline as Markdown, its measured table marked with its source (tests/test_docs.py checks the numbers)."""
    h = headline(evidence)
    on_gpu = str(((evidence.get("machine") or {}).get("info") or {}).get("device", "")).startswith("cuda")
    kind = ("a dry run on a CPU (tiny sizes: not evidence of speed)" if h["dry"] else "one GPU" if on_gpu
            else "a CPU, full sizes (no GPU in this run)")
    lines = [f"**{h['device']}**, {h['date']}, {kind}: `make gpu-evidence` at commit {evidence['commit']}."]
    lad = h["ladder"]
    if lad:
        lines += ["", f"<!-- source: {source} -->", "| measure | value |", "|---|---:|",
                  f"| reference (tutorial loop) images/s | {lad['reference_images_per_sec']:.0f} |",
                  f"| best: {lad['best']} images/s | {lad['best_images_per_sec']:.0f} |",
                  f"| best against the reference | {lad['best_speedup']:.2f}x |",
                  f"| a training step's GFLOP per image ({lad['top']}) | {lad['gflop_per_image']:.2f} |",
                  f"| {lad['top']} TFLOP/s | {lad['top_tflops']:.2f} |"]
        if lad["top_mfu"] is not None:
            lines.append(f"| {lad['top']} MFU (published bf16 peak) | {100 * lad['top_mfu']:.1f}% |")
        if lad["top_of_matmul"] is not None:
            lines.append(f"| {lad['top']} against the {lad['matmul_precision']} matmul measured there "
                         f"({lad['matmul_tflops']:.1f} TFLOP/s) | {100 * lad['top_of_matmul']:.1f}% |")
        if h["climb"]:
            lines += _climb_lines(h["climb"])
        if h["quality"]:
            q = h["quality"]
            lines.append(f"| FID after {q['images']:,} images: reference / {q['variant']} | "
                         f"{q['reference_fid']:.1f} / {q['fid']:.1f} |")
    elif _part(evidence, "ladder"):
        lines += ["", "The ladder did not finish: see the report."]
    if h["graphs"]:
        lines += ["", _graphs_line(h["graphs"])]
    if h["check"]:
        passed = [c["row"] for c in h["check"] if c["ok"]]
        failed = [c for c in h["check"] if not c["ok"]]
        partial = ((_part(evidence, "check") or {}).get("result") or {}).get("partial")
        lines += ["", f"`gantools check`{' (stopped before its last row)' if partial else ''}: "
                      f"{len(passed)} of {len(h['check'])} rows ok"
                      + (f" ({', '.join(passed)})" if 0 < len(passed) <= SHOWN_ROWS else
                         " (each named in the report)" if passed else "") + "."]
        lines += [f"FAILED: {c['row']}: {c['reason']}" for c in failed]
    return "\n".join(lines)


def _machine_lines(evidence: dict) -> list[str]:
    info = (evidence.get("machine") or {}).get("info") or {}
    smi = (evidence.get("machine") or {}).get("nvidia_smi") or {}
    rows = [("device", f"{info.get('device_name', '?')} ({info.get('device', '?')})"
                       + (f", compute capability {info['compute_capability']}" if "compute_capability" in info else "")
                       + (f", {info['gpu_memory_gb']} GB" if "gpu_memory_gb" in info else "")),
            ("driver", smi.get("driver", "no nvidia-smi here")),
            ("torch", f"{info.get('torch', '?')} (CUDA {info.get('cuda_build')}, cuDNN {info.get('cudnn', '-')})"),
            ("Python", info.get("python", "?")), ("CPU cores", str(info.get("cpu_cores", "?"))),
            ("platform", info.get("platform", "?"))]
    if smi:
        rows.append(("clocks, power", f"max SM clock {smi.get('max_sm_clock', '?')}, power limit "
                                      f"{smi.get('power_limit', '?')}"))
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def report_markdown(evidence: dict) -> str:
    took = sum(p["seconds"] for p in evidence["parts"]) + ((evidence.get("install") or {}).get("seconds") or 0)
    lines = [f"# gantools GPU evidence: {device_name(evidence)}, {evidence['date']}", "",
             f"`make gpu-evidence`{' (dry run: a CPU, tiny sizes)' if evidence['dry'] else ''} at commit "
             f"{evidence['commit']}, started {evidence['started']}: {took:.0f} s of its {evidence['total_budget_s']} s "
             "budget. Every number below was measured in this run.", "", "## The machine", "",
             *_machine_lines(evidence), ""]
    inst = evidence.get("install") or {}
    if "error" in inst:
        lines += ["The install failed, so no part ran:", "", _fenced(inst["error"]), ""]
    elif inst:
        lines += [f"Installed from the wheel folder: {', '.join(inst['installed']) or 'nothing (all present)'}."]
        if inst.get("import_failures"):
            lines += ["Would not import (the parts that need them fail and say so): " + "; ".join(
                f"{k}: {v}" for k, v in inst["import_failures"].items()) + "."]
        lines += [""]
    lines += ["## Headline", "", headline_markdown(evidence, EVIDENCE), "", "## The parts", "",
              "| part | budget s | allowed s | took s | result |", "|---|---:|---:|---:|---|"]
    lines += [f"| {p['name']} | {p['budget_s']} | {p['allowed_s']} | {p['seconds']:.0f} | {p['status']} |"
              for p in evidence["parts"]]
    for p in evidence["parts"]:
        lines += ["", f"## {p['name']}", "", p["what"][0].upper() + p["what"][1:] + ".", ""]
        body = _part_body(p, evidence)
        if body:
            lines += [body]
        if p["traceback"]:
            lines += ["", "Its failure, as printed:", "", "```text", p["traceback"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _fenced(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```"


def _printed(p: dict, start: str) -> str:
    """What a part printed from the line starting with `start` on (its table or report), else its tail."""
    text = p["output_tail"]
    at = text.find(start)
    return text[at:] if at >= 0 else text[-2000:]


def _part_body(p: dict, evidence: dict) -> str:
    r = p["result"]
    if p["name"].startswith("check") and r:
        body = _fenced(_printed(p, "gantools check on")) if not r.get("partial") else (
            "Stopped before its last row; the rows it finished:\n\n" + "\n".join(
                f"- {x['technique']}: {'ok' if x['ok'] else 'FAILED: ' + str(x['reason'])}" for x in r["rows"]))
        if r.get("cuda_only_not_run"):
            body += "\n\nNot applicable on this CPU (CUDA only): " + ", ".join(r["cuda_only_not_run"]) + "."
        return body
    if p["name"] in ("ladder", "quality") and r and r.get("machine"):
        at = p["output_tail"].find(r["machine"].get("device_name", "?"))
        table = p["output_tail"][at:].split("\nJSON:")[0] if at >= 0 else ""
        extra = f"\n\nImages per variant: {r.get('why')}." if p["name"] == "quality" else ""
        chart = "\n\n![the ladder](bench.png)" if p["name"] == "ladder" else ""
        return table.strip() + extra + chart
    if p["name"].startswith("doctor") and p["status"] != "skipped":
        tail = _printed(p, "gantools doctor")
        kept = ((r or {}).get("try") or {}).get("kept")
        return _fenced(tail[-4000:]) + (f"\n\nThe patch: `{p['name']}.patch`." if kept else "")
    if p["name"] == "machine":
        return ""
    if p["name"] == "graphs" and r:  # its one line of result (the log holds the code it ran)
        return _graphs_line(r)
    if p["name"] == "folder" and r and r.get("lines"):  # its figures, in the words folder_speed.lines gives
        return "\n".join(f"- {line}" for line in r["lines"])
    if p["output_tail"]:
        return _fenced(p["output_tail"][-1500:])
    return ""
