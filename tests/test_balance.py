"""gantools.workbook.balance: a run's failure named from its logged game (D overpowering G, an oscillating game, or as
balanced as the start), and a FID change counted only beyond what a second seed moves it."""
from gantools.workbook.balance import balance, fid_against_seed
from gantools.core.history import History


def _history(loss_d, loss_g, d_real=0.8, d_fake=0.2):
    return History([{"step": i + 1, "loss_d": d, "loss_g": g, "d_real": d_real, "d_fake": d_fake}
                    for i, (d, g) in enumerate(zip(loss_d, loss_g, strict=True))])


def test_balance_names_a_d_that_overpowers_g_an_oscillating_game_and_a_balanced_one():
    start = _history([0.9, 0.5, 0.6, 0.5], [3.0, 3.2, 3.1, 3.0])
    runs = {"start": start,
            "strong D": _history([0.5, 0.1, 0.05, 0.04], [6.0, 7.0, 6.5, 7.0], d_real=0.98, d_fake=0.02),
            "swinging": _history([0.9, 0.6, 0.5, 0.6], [3.0, 1.0, 6.0, 1.0]),
            "same": _history([0.2, 0.2, 0.6, 0.5], [9.0, 9.0, 3.0, 3.1])}
    found = balance(runs)
    assert found.rows["start"]["loss_d"] == 0.55  # the mean of the second half only
    assert "D overpowers G" in found.diagnosis("strong D", "start")
    assert "0.045" in found.diagnosis("strong D", "start") and "0.550" in found.diagnosis("strong D", "start")
    assert "oscillates" in found.diagnosis("swinging", "start")
    assert "as balanced as start" in found.diagnosis("same", "start")
    assert "| strong D | 0.980 | 0.020 |" in found._repr_markdown_()


def test_a_fid_change_counts_only_beyond_what_a_second_seed_moves_it():
    def run(fid, covered=9):
        return {"fid": fid, "classes_covered": covered, "classes": 10}
    start, seed = run(100.0), run(125.0)
    worse = fid_against_seed("x", run(300.0, 8), start, seed, "Adam")
    assert "worse than Adam" in worse and "3.00x" in worse and "classes covered 8 against 9" in worse
    assert "no different from Adam" in fid_against_seed("x", run(120.0), start, seed, "Adam")
    assert "better than Adam" in fid_against_seed("x", run(70.0), start, seed, "Adam")
    assert "no different" in fid_against_seed("x", run(105.0), start, start, "Adam")
    assert "collapsed" in fid_against_seed("x", run(300.0, 1), start, seed, "Adam")


def test_early_generators_fids_are_not_judged():
    def run(fid, covered=3):
        return {"fid": fid, "classes_covered": covered, "classes": 10}
    early = fid_against_seed("fused", run(389.0), run(296.0), run(285.0), "Adam")
    assert "not judged" in early and "worse" not in early and "389.0" in early
    assert "collapsed" in fid_against_seed("x", run(971.0, 1), run(296.0), run(285.0), "Adam")


def test_with_a_second_seed_a_difference_counts_only_beyond_what_the_seed_shows():
    start = _history([0.9, 0.5, 0.6, 0.5], [3.0, 3.2, 3.1, 3.0])
    runs = {"start": start,
            "seed 1": _history([0.9, 0.2, 0.25, 0.2], [3.0, 1.0, 6.0, 1.0]),  # D low and swinging: it happens
            "weaker": _history([0.5, 0.2, 0.2, 0.2], [3.0, 2.0, 4.0, 2.0]),
            "strong D": _history([0.5, 0.05, 0.05, 0.05], [6.0, 7.0, 6.5, 7.0], d_real=0.98, d_fake=0.02),
            "wild": _history([0.9, 0.6, 0.5, 0.6], [3.0, 0.0, 12.0, 0.0])}
    found = balance(runs)
    assert "D overpowers G" in found.diagnosis("weaker", "start")
    assert "as balanced as start" in found.diagnosis("weaker", "start", seed="seed 1")
    assert "within what seed 1 differs by" in found.diagnosis("weaker", "start", seed="seed 1")
    strong = found.diagnosis("strong D", "start", seed="seed 1")
    assert "D overpowers G" in strong and "(seed 1: 0.225)" in strong
    assert "oscillates" in found.diagnosis("wild", "start", seed="seed 1")
