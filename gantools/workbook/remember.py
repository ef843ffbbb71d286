"""What to remember: the few rules that close each notebook, the ones a learner carries into their own loop. Each
rule comes with the number that shows it in this run (filled from the notebook's own variables, so a run on your
machine shows yours) and, where a GPU differs, what an H200 measured in the project's stored evidence (docs/gpu,
read here, never typed in) or what to expect there and why."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

MAX_RULES = 6  # more than this is a summary, not what a reader remembers
EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "gpu"


@dataclass(frozen=True)
class Rule:
    """One rule: what to do (`rule`, imperative, one sentence), the number from this run that shows it (`here`) and
    what a GPU measured or is expected to do (`gpu`; None where a GPU changes nothing)."""

    rule: str
    here: str
    gpu: str | None = None


class Remember(list):
    """The rules as a notebook shows them: a heading and a numbered list."""

    def _repr_markdown_(self) -> str:
        lines = ["## What to remember", ""]
        for i, r in enumerate(self, 1):
            lines.append(f"{i}. **{r.rule}** Here: {r.here}." + (f" On a GPU: {r.gpu}." if r.gpu else ""))
        return "\n".join(lines)


def what_to_remember(*rules: Rule) -> Remember:
    """At most `MAX_RULES` rules, in the order a reader should apply them."""
    if not 1 <= len(rules) <= MAX_RULES:
        raise ConfigError(f"what to remember holds 1 to {MAX_RULES} rules, not {len(rules)}: keep the ones a "
                          "reader would apply first")
    return Remember(rules)


def _newest_ladder(evidence: Path = EVIDENCE) -> tuple[dict, Path] | None:
    """The newest stored GPU ladder's result (`make gpu-evidence`'s ladder part) and its folder; None where none
    is stored."""
    for folder in sorted(evidence.glob("*"), reverse=True):
        try:
            parts = json.loads((folder / "evidence.json").read_text())["parts"]
        except (OSError, ValueError, KeyError):
            continue
        ladder = next((p.get("result") for p in parts if p.get("name") == "ladder" and p.get("status") == "ok"), None)
        if ladder and ladder.get("rows"):
            return ladder, folder
    return None


def h200_ladder(evidence: Path = EVIDENCE) -> dict:
    """The newest stored GPU ladder (`make gpu-evidence`'s ladder part): variant -> its speed-up over the tutorial
    loop, plus 'setting' (what it trained, where) and 'report' (the folder it came from); {} where none is stored
    (an installed package without the repository's docs)."""
    newest = _newest_ladder(evidence)
    if newest is None:
        return {}
    ladder, folder = newest
    cfg, machine = ladder["config"], ladder["machine"]
    found = {row["variant"]: row["speedup"] for row in ladder["rows"]}
    found["setting"] = (f"{machine.get('device_name', 'GPU')}, DCGAN {cfg['image_size']} px, batch "
                        f"{cfg['batch_size']}, median of {len(ladder['rows'][0]['images_per_sec_runs'])} "
                        "interleaved repeats")
    found["report"] = f"docs/gpu/{folder.name}"
    return found


def h200_warmup_s(variant: str, evidence: Path = EVIDENCE) -> float | None:
    """The seconds the stored GPU ladder's `variant` took to warm up before its timed repeats (torch.compile's
    compile time included), or None where no stored ladder measured it."""
    newest = _newest_ladder(evidence)
    rows = {row["variant"]: row for row in newest[0]["rows"]} if newest else {}
    return rows.get(variant, {}).get("warmup_s")


def on_h200(variant: str, ladder: dict | None = None) -> str:
    """'1.80x the tutorial loop on an NVIDIA H200 (DCGAN 64 px, batch 128, ...; docs/gpu/...)' for a ladder variant,
    or a sentence saying no GPU measured it."""
    ladder = h200_ladder() if ladder is None else ladder
    if variant not in ladder:
        return "no stored GPU run measured this yet"
    return f"{ladder[variant]:.2f}x the tutorial loop ({ladder['setting']}; {ladder['report']})"
