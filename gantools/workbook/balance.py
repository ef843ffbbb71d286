"""What a change of settings did to a GAN: who is winning its game, read from the runs' logged histories (the
evidence that tells a discriminator that has overpowered its generator, with D's loss near 0, D(real) near 1 and
D(fake) near 0, from a game that swings back and forth or one as balanced as the run it is compared with), and
whether its FID moved by more than a second seed of the unchanged run moves it."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..speed.keep import judge_fid
from .conclusions import still_learning
from .display import markdown_table

COLUMNS = ("d_real", "d_fake", "loss_d", "loss_g")
OVERPOWERED = 0.5  # D's loss below half the start's: D separates real from fake clearly better than in the start
SWINGS = 2.0       # a loss spread over twice the start's: the game oscillates


@dataclass
class Balance:
    """Per run (name -> values): the means of D(real), D(fake), D's and G's losses over the last part of the run,
    and the spread (standard deviation) of each loss there."""
    rows: dict
    tail: float

    def _repr_markdown_(self) -> str:
        head = ["run", "D(real)", "D(fake)", "D loss", "G loss", "D loss spread", "G loss spread"]
        keys = (*COLUMNS, "spread_d", "spread_g")
        return markdown_table(head, [[name, *(f"{row[k]:.3f}" for k in keys)] for name, row in self.rows.items()])

    def diagnosis(self, name: str, start: str, seed: str | None = None) -> str:
        """One sentence on run `name` against run `start`, with the numbers that back it. With `seed` (the start's
        config with another seed), a difference counts only beyond what that second seed shows: two runs of one
        setting already differ (see `drift.lockstep`)."""
        run, ref = self.rows[name], self.rows[start]
        other = self.rows[seed] if seed is not None else ref
        part = f"over the last {100 * self.tail:.0f}% of the run"
        scale = f" ({seed}: {other['loss_d']:.3f})" if seed is not None else ""
        if run["loss_d"] < OVERPOWERED * min(ref["loss_d"], other["loss_d"]):
            return (f"**{name}**: D overpowers G. {part.capitalize()} D's loss averaged {run['loss_d']:.3f} against "
                    f"{ref['loss_d']:.3f} for {start}{scale}, with D(real) {run['d_real']:.2f} and D(fake) "
                    f"{run['d_fake']:.2f}: D tells the fakes apart almost every time, so G learns only where its "
                    "images are wrong, not what would be right.")
        swing = max(ref["spread_g"], other["spread_g"])
        if run["spread_g"] > SWINGS * swing:
            scale = f" ({seed}: {other['spread_g']:.2f})" if seed is not None else ""
            return (f"**{name}**: the game oscillates. {part.capitalize()} G's loss spread {run['spread_g']:.2f} "
                    f"against {ref['spread_g']:.2f} for {start}{scale}: each player keeps overshooting the other's "
                    "move.")
        within = f", within what {seed} differs by" if seed is not None else ""
        return (f"**{name}**: as balanced as {start} {part}{within} (D's loss {run['loss_d']:.3f} against "
                f"{ref['loss_d']:.3f}, G's loss spread {run['spread_g']:.2f} against {ref['spread_g']:.2f}).")

def balance(histories: dict, tail: float = 0.5) -> Balance:
    """`Balance` of each run in `{name: History}` over its last `tail` of logged records (at least one)."""
    rows = {}
    for name, history in histories.items():
        records = history.records[-max(1, round(tail * len(history.records))):]
        row = {k: statistics.fmean(r[k] for r in records) for k in COLUMNS}
        row["spread_d"] = statistics.pstdev(r["loss_d"] for r in records)
        row["spread_g"] = statistics.pstdev(r["loss_g"] for r in records)
        rows[name] = row
    return Balance(rows, tail)


def fid_against_seed(change: str, run: dict, start: dict, other_seed: dict, start_name: str) -> str:
    """A sentence on how far `change` moved FID (and classes covered) from `start`, judged by the rule tune and
    doctor --try use (`keep.judge_fid`, with the second seed already trained here): two GAN runs differ by more than
    rounding (see `drift.lockstep`), so a FID difference counts only beyond both `keep.QUALITY_TARGET` and what a
    second seed shows. Between generators still early in training (`conclusions.still_learning`) it does not count
    at all, unless the run collapsed onto one class.

    Args:
        change: the change's name, as the sentence shows it.
        run: the changed run's summary (fid, classes_covered, classes).
        start: the start's, at the same number of images.
        other_seed: the start's config trained with another seed, at the same number of images.
        start_name: the start's name, as the sentence shows it.

    Returns:
        The sentence, in Markdown."""
    judged = judge_fid(run["fid"], start["fid"], other_seed["fid"])
    noise = other_seed["fid"] / start["fid"]
    if run["classes_covered"] == 1 < start["classes_covered"]:
        judged_words = "collapsed: it draws a single class"
    elif still_learning(run, start, other_seed):
        judged_words = ("not judged: these generators are still early in training (fewer than 8 of 10 classes), "
                        "where FID moves far more from run to run than one second seed shows; read the game's balance "
                        "below instead")
    elif judged.worse:
        judged_words = f"worse than {start_name}, by more than a second seed moves it"
    elif judged.better:
        judged_words = f"better than {start_name}, by more than a second seed moves it"
    else:
        judged_words = f"no different from {start_name}: within what a second seed moves it"
    return (f"**{change}**: FID {run['fid']:.1f} against {start['fid']:.1f} ({judged.moved:.2f}x), "
            f"classes covered {run['classes_covered']} against {start['classes_covered']}; {start_name} with "
            f"another seed scored {other_seed['fid']:.1f} ({noise:.2f}x): **{judged_words}**.")
