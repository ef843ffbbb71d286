"""gantools.speed.keep: the keep-or-drop rule tune, doctor --try and the notebooks share (speed in two stages, FID
against a second seed's spread, that seed trained only when the decision needs it)."""
import ast
import json
from pathlib import Path

import pytest

from gantools.speed import keep
from gantools.speed.keep import QUALITY_TARGET, decide, decide_in_two, judge_fid, too_noisy
from gantools.measuring.turns import Spread

INC = [100, 90, 110, 100, 100]


def test_the_rule_keeps_a_winner_of_every_repeat_and_measures_a_close_call_again():
    kept, ratio, spread, why = decide(INC, [120, 99, 130, 110, 105], final=False)
    assert kept and ratio == pytest.approx(1.10, abs=0.01) and spread[0] > 1 and "all 5 repeats" in why
    kept, ratio, spread, why = decide(INC, [130, 85, 140, 110, 99], final=False)  # faster on median, lost two
    assert kept is None and ratio > 1 and spread[0] < 1 and "undecided" in why and "3 of 5" in why
    kept, _, _, why = decide(INC, [90, 95, 99, 100, 120], final=False)
    assert kept is False and "not faster" in why
    # measured again: 10 paired repeats, kept with 8 wins, not with 7
    kept, _, _, why = decide(INC * 2, [130, 85, 140, 110, 99, 130, 95, 120, 110, 105])
    assert kept is True and "8 of 10" in why
    kept, _, _, why = decide(INC * 2, [130, 85, 140, 110, 99, 130, 85, 120, 110, 105])
    assert kept is False and "only 7 of 10" in why


def test_a_first_measurement_that_decides_is_not_measured_again():
    asked = []
    kept, _, _, why = decide_in_two(INC, [120, 99, 130, 110, 105], lambda why: asked.append(why))
    assert kept is True and why.startswith("kept: ") and asked == []
    kept, _, _, why = decide_in_two(INC, [90, 95, 99, 100, 120], lambda why: asked.append(why))
    assert kept is False and "not faster" in why and asked == []


def test_a_close_call_is_measured_again_and_decided_on_all_the_repeats():
    asked = []
    incumbent, candidate = list(INC), [130, 85, 140, 110, 99]

    def again(why):
        asked.append(why)
        incumbent.extend(INC)  # a caller may extend its own lists: the first stage's runs count once
        candidate.extend([130, 95, 120, 110, 105])
        return INC, [130, 95, 120, 110, 105]

    kept, _, _, why = decide_in_two(incumbent, candidate, again)
    assert asked and asked[0].startswith("undecided: ") and "3 of 5" in asked[0]
    assert kept is True and "8 of 10" in why
    kept, _, _, why = decide_in_two(INC, [130, 85, 140, 110, 99], lambda why: (INC, [130, 85, 120, 110, 105]))
    assert kept is False and "only 7 of 10" in why


def test_a_close_call_without_time_to_measure_it_again_is_not_kept():
    kept, ratio, _, why = decide_in_two(INC, [130, 85, 140, 110, 99], lambda why: None)
    assert kept is False and ratio > 1
    assert why.startswith("not kept: ") and "undecided" not in why and why.endswith("no time left to measure it again")


WILD = [6, 143, 754, 125, 91]  # over INC: 0.06x to 7.54x, the ratios a loaded machine gave


def test_a_range_wider_than_the_effect_is_measured_again_and_then_neither_kept_nor_dropped():
    asked = []
    kept, ratio, spread, why = decide(INC, WILD, final=False)
    assert kept is None and why.startswith("undecided: ") and "measure again on a quiet machine" in why
    kept, ratio, spread, why = decide_in_two(INC, WILD, lambda why: asked.append(why) or (INC, WILD))
    assert asked and kept is None and why.startswith("too noisy: ") and why.endswith("on a quiet machine")
    kept, _, _, why = decide_in_two(INC, WILD, lambda why: None)  # no time to measure it again: still not a drop
    assert kept is None and why.startswith("too noisy: ")
    # a won range is kept however wide; a change that does nothing on a quiet machine has a range wider than its
    # effect but narrow, and is decided as before
    assert not too_noisy(1.2, Spread(1.05, 1.9)) and not too_noisy(1.0, Spread(0.97, 1.04))
    assert decide(INC, [103, 89, 108, 98, 99])[0] is False


def test_the_second_seed_is_trained_only_when_fid_rose_past_the_target():
    trained = []

    def seed():
        trained.append(1)
        return 20.0

    within = judge_fid(10.5, 10.0, seed)
    assert not within.worse and trained == [] and within.seed_fid is None and within.limit == QUALITY_TARGET
    better = judge_fid(5.0, 10.0, seed)
    assert better.better and trained == [], "a lower FID keeps the change: no seed needed to decide"
    noisy = judge_fid(15.0, 10.0, seed)  # 1.5x worse, but a second seed moves FID 2x: within its noise
    assert trained == [1] and noisy.seed_fid == 20.0 and noisy.spread == 2.0 and noisy.limit == 2.0
    assert not noisy.worse
    assert judge_fid(15.0, 10.0, lambda: 10.5).worse, "past both the target and the seed's spread"


def test_a_known_second_seed_always_widens_the_limit_and_none_leaves_the_target():
    judged = judge_fid(7.0, 10.0, 5.0)  # the seed scored half the start's FID: spread 2x either way
    assert judged.limit == 2.0 and not judged.better and not judged.worse
    assert judge_fid(4.0, 10.0, 5.0).better
    alone = judge_fid(11.5, 10.0)
    assert alone.worse and alone.limit == QUALITY_TARGET and alone.spread is None
    assert not judge_fid(10.9, 10.0).worse


# -- one keep rule ----------------------------------------------------------------------------------------------------
# A keep rule compares a speed figure with 1 (`spread.low > 1`, `speedup >= 1 + band`). speed/keep.py holds the one
# rule; anywhere else in the package or the notebooks' code, such a comparison is a second rule in the making.
SPEED_NAMES = {"ratio", "ratios", "speedup", "spread", "paired", "low", "high", "wins", "faster", "measured", "pace"}


def _is_one(node) -> bool:
    """1, or a number near it (a band: 1.05, 0.95), or arithmetic on one (1 + band)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return 0.9 <= node.value <= 1.1
    return isinstance(node, ast.BinOp) and (_is_one(node.left) or _is_one(node.right))


def _speed_name(node) -> bool:
    """A name, attribute or string key (row["speedup"]) that names a speed figure."""
    for n in ast.walk(node):
        name = (n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else
                n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else "")
        if SPEED_NAMES & set(name.lower().replace(" ", "_").split("_")):
            return True
    return False


def second_rules(source: str) -> list[str]:
    """The comparisons of a speed figure with 1 in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_one(o) for o in operands) and any(_speed_name(o) for o in operands if not _is_one(o)):
                found.append(ast.unparse(node))
    return found


def _sources():
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "gantools").rglob("*.py")):
        if path != root / "gantools" / "speed" / "keep.py":
            yield path.name, path.read_text()
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":  # IPython's magics and shell lines are not Python
                yield path.name, "\n".join(line for line in "".join(cell["source"]).splitlines()
                                           if not line.lstrip().startswith(("%", "!")))


def test_the_package_and_the_notebooks_have_one_keep_rule():
    assert second_rules("verdict = 'faster' if spread.low > 1 else 'no difference'"), "the scan finds a rule"
    assert second_rules("gained = measured >= 1 + SPEED_BAND")
    assert second_rules("kept = row['speedup'] > 1") and second_rules("ok = speedup >= 1.05")
    assert not second_rules("if self.iterations > 1: pass"), "only speed figures count"
    found = [(name, rule) for name, source in _sources() for rule in second_rules(source)]
    assert not found, f"a keep rule outside speed/keep.py (decide with keep or conclusions.speed_verdict): {found}"


def test_notebook_verdicts_are_tunes_decisions():
    """9 wins in 10 paired repeats: tune keeps it, so the notebooks call it faster; the inverse is slower; a wide
    range that holds 1 is too noisy, as tune and doctor --try say."""
    from gantools.measuring.turns import Paired
    from gantools.workbook import conclusions as c

    nine = Paired([0.99, 1.04, 1.05, 1.03, 1.06, 1.02, 1.04, 1.05, 1.03, 1.04])
    assert keep.decide_paired(nine)[0] is True and c.speed_verdict(nine) == c.FASTER
    assert c.speed_verdict(Paired(1 / r for r in nine.ratios)) == c.SLOWER
    assert c.speed_verdict(Paired([0.6, 1.5, 1.05])) == c.TOO_NOISY
    assert c.speed_verdict(Paired([0.98, 1.03, 1.01, 0.99, 1.02])) == c.NO_DIFFERENCE
    assert c.speed_verdict((1.1, 1.3)) == c.FASTER, "a bare (low, high) is read as its two ends"
    four_of_five = Paired([1.04, 1.05, 0.99, 1.03, 1.06])  # a first look tune would measure again: not kept once
    assert keep.decide_once(four_of_five)[0] is False and c.speed_verdict(four_of_five) == c.NO_DIFFERENCE
    # too noisy either way round is too noisy, whichever arm is the start
    wide = Paired([1.161, 1.138, 1.031, 0.725, 0.957, 1.1, 0.75, 0.908, 1.055, 1.122])
    assert c.speed_verdict(wide) == c.speed_verdict(Paired(1 / r for r in wide.ratios)) == c.TOO_NOISY


def test_quality_is_not_judged_between_runs_that_draw_too_few_classes():
    few = {"classes_covered": 5, "classes": 10}
    enough = {"classes_covered": 8, "classes": 10}
    judged = keep.judge_fid(50.0, 20.0, classes={"the start": enough, "the change": few})
    assert judged.not_judged and "the change draws 5 of 10 classes" in judged.not_judged
    assert not judged.worse and not judged.better, "not judged is neither worse nor better"
    assert keep.judge_fid(50.0, 20.0, classes={"the start": enough, "the change": enough}).worse
    assert keep.judge_fid(50.0, 20.0, classes={"a folder": {"classes_covered": None}}).worse, "no classifier: FID"
