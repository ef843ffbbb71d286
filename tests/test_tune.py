"""gantools.tuning: the profile, fix, measure loop run by gantools itself. Tiny models and short plans: each tune here
takes seconds. Where a test needs a deterministic quality verdict it passes its own quality function. Every tune here
reads a fake clock (conftest's `fake_clock`): its budget is spent when the test says, never by a busy machine, and
what tune decides from measured speeds is either replaced (`keep.decide`) or accepted either way."""
import json
import math
import os
import signal
import threading

import pytest
import torch

from gantools import TrainConfig, tune
from gantools.cli import main
from gantools.core.config import speed_knobs
from gantools.speed import keep
from gantools.tuning.result import Step
from gantools.tuning.space import Candidate, describe, search_space
from gantools.tuning.trials import Failure, key

from conftest import BatchFreeD, BatchFreeG, measurements_take, weights

PLAN = dict(warmup_images=64, images_per_repeat=512, repeats=3)  # tiny models: chunks of a few tenths of a second
# where keep's rule is replaced (or never reached) the chunks only have to run: what is decided does not rest on them
RULE_REPLACED = dict(PLAN, images_per_repeat=64)
DATA_KNOBS = {"num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "transform", "loader"}
pytestmark = pytest.mark.usefixtures("fake_clock")


def test_the_search_space_holds_what_applies_here_likeliest_first(tmp_path):
    cpu = torch.device("cpu")
    cfg = TrainConfig(loss="bce-sigmoid", transform="per-sample", num_workers=2, sync_every_step=True,
                      freeze_d=False, out_dir=str(tmp_path))
    candidates, skipped = search_space(cfg, cpu)
    changes = [c.change for c in candidates]
    assert changes[0] == {"precision": "bf16", "loss": "bce"}  # the same loss from logits: what bf16 needs
    assert {"loader": "device", "transform": "on-device", "num_workers": 0} in changes  # completed to be valid
    assert [c.prior for c in candidates] == sorted((c.prior for c in candidates), reverse=True)
    every = {k for change in changes for k in change}
    assert every <= set(speed_knobs()) | {"loss"}, "only speed knobs (and bce-sigmoid -> bce) ever change"
    assert not any("fp16" in str(c) or "pin_memory" in c or "tf32" in c or "cudnn_benchmark" in c for c in changes)
    assert {c for c, _ in skipped} >= {"precision=fp16", "pin_memory=True", "tf32=True", "cudnn_benchmark=True"}
    assert not any(c.get("compile") == "reduce-overhead" for c in changes)  # CUDA graphs: never on a CPU
    for change in changes:
        cfg.replace(**change).validate()
    bigger = search_space(cfg, cpu, space=("batch_size",))[0][0].change
    assert bigger["batch_size"] == 256 and bigger["lr_g"] == pytest.approx(2e-4 * math.sqrt(2))
    assert search_space(cfg.replace(grad_accum_steps=4), cpu, space=("grad_accum_steps",))[0][0].change == \
        {"grad_accum_steps": 2}, "fewer, larger micro-batches only: more never makes a step faster"


def test_workers_and_pinning_are_offered_only_for_a_dataset_of_cpu_tensors(tiny):
    """A dataset whose items are already on the GPU: a forked worker cannot use CUDA, and such tensors cannot be
    pinned, so neither is tried (nor the profiler's fix of more workers)."""
    from gantools.tuning.space import allowed

    cuda, space = torch.device("cuda"), ("num_workers", "persistent_workers", "pin_memory")
    offered = {k for c in search_space(tiny, cuda, space, own_dataset=True)[0] for k in c.change}
    assert offered >= {"num_workers", "pin_memory"}
    candidates, skipped = search_space(tiny, cuda, space, own_dataset=True, cpu_tensors=False)
    assert candidates == []
    reasons = dict(skipped)
    assert "not on the CPU" in reasons["pin_memory=True"] and "CUDA" in reasons[f"num_workers={min(os.cpu_count(), 2)}"]
    fix = {"num_workers": 2, "persistent_workers": True}
    assert allowed(fix, tiny, space) and not allowed(fix, tiny, space, cpu_tensors=False)


@pytest.mark.slow
def test_a_data_starved_config_gets_a_data_loading_fix_first(tiny, tmp_path, monkeypatch):
    """The tutorial's per-image PIL transforms in the training process: where the profile's verdict is data-bound
    (set here: the share a loop waits is the profiler's to measure, tests/test_profiling.py), tune's first candidate
    is the verdict's data-loading fix, measured and recorded. Whether the fix won its repeats is not asserted, only
    that the verdict picked it and that what was decided is what the result and its JSON hold; the stop ends the
    search after it."""
    from gantools.speed import profiling

    monkeypatch.setattr(profiling, "bottleneck", lambda *args: "data-bound")
    cfg = tiny.replace(transform="per-sample", batch_size=64)

    def stop_once_measured(result):
        if result.path:
            stop.set()

    stop = threading.Event()
    result = tune(cfg, minutes=30, quality=lambda c: {"fid": 1.0}, plan=PLAN, progress=None, stop=stop,
                  on_update=stop_once_measured)
    assert result.path, result.markdown()
    first = result.path[0]
    assert first.source == "verdict: data-bound", result.markdown()
    assert first.change == {"transform": "on-device"} and set(first.change) <= DATA_KNOBS
    assert first.images_per_sec > 0 and first.incumbent_images_per_sec > 0 and len(first.spread) == 2
    assert first.why.startswith("kept") is bool(first.accepted), first.why
    kept_cfg = cfg.replace(transform="on-device") if first.accepted else cfg
    assert result.final_config == kept_cfg and result.stopped
    path = result.save_json(tmp_path / "tune.json")
    saved = json.loads(path.read_text())
    for point in ("start", "final"):
        assert {"config", "images_per_sec", "fid"} <= set(saved[point])
    assert saved["final"]["config"]["transform"] == kept_cfg.transform
    assert saved["start"]["config"]["transform"] == "per-sample"
    step = saved["path"][0]
    assert {"change", "images_per_sec", "ratio_to_start", "accepted", "why"} <= set(step)
    assert step["change"] == first.change and step["accepted"] is first.accepted and step["why"] == first.why


@pytest.mark.slow
def test_a_data_starved_folder_is_first_offered_its_cache_read_without_a_dataloader(tiny, tmp_path, monkeypatch):
    """A folder decoded by PIL per sample, judged data-bound (set here, as above): tune's first candidate is the
    verdict's fix, the folder decoded once into its cache and read with loader='auto', and it trains (the cache is
    built under the run's data root). Whether it won its repeats is not asserted."""
    from gantools.core.data import write_glyph_pngs
    from gantools.speed import profiling

    monkeypatch.setattr(profiling, "bottleneck", lambda *args: "data-bound")
    folder = write_glyph_pngs(tmp_path / "images", 64, 32, 1)
    cfg = tiny.replace(dataset="folder", data_path=str(folder), transform="per-sample",
                       data_root=str(tmp_path / "data"))
    stop = threading.Event()
    result = tune(cfg, minutes=30, quality=lambda c: {"fid": 1.0}, plan=RULE_REPLACED, progress=None, stop=stop,
                  on_update=lambda r: stop.set() if r.path else None, space=tuple(DATA_KNOBS))
    first = result.path[0]
    assert first.source == "verdict: data-bound", result.markdown()
    assert first.change == {"transform": "on-device", "loader": "auto"} and first.images_per_sec > 0
    assert any((tmp_path / "data" / "folder-cache").iterdir())


@pytest.mark.slow
def test_quality_backs_off_the_last_kept_changes_until_fid_holds(tiny, glyphs64, monkeypatch):
    """Every measured candidate is kept (the rule replaced, so the path is known); the quality function makes the
    last one (for-loop Adam) "hurt" FID: the check backs off that change alone, re-scoring each config."""
    monkeypatch.setattr(keep, "decide", lambda inc, cand, final=True: (True, 1.1, (1.05, 1.2), "kept (test)"))
    scored = []

    def quality(c):
        scored.append(c)
        return {"fid": 20.0 if c.optimizer_impl == "for-loop" else 10.0, "kid": 0.01}

    cfg = tiny.replace(loader="device", sync_every_step=True)
    result = tune(cfg, minutes=5, dataset=glyphs64, quality=quality, plan=RULE_REPLACED, progress=None,
                  space=("sync_every_step", "optimizer_impl"))
    assert [describe(s.change) for s in result.path] == ["sync_every_step=False", "optimizer_impl=fused",
                                                         "optimizer_impl=foreach", "optimizer_impl=for-loop"], \
        result.ended
    assert [s.backed_off for s in result.path] == [False, False, False, True]
    final = result.final_config
    assert final == cfg.replace(sync_every_step=False, optimizer_impl="foreach")
    assert scored == [cfg, cfg.replace(sync_every_step=False, optimizer_impl="for-loop"), cfg.replace(seed=1), final]
    assert [t["held"] for t in result.quality["tries"]] == [False, True] and result.quality["held"]
    assert result.final["fid"] == 10.0 and result.start["fid"] == 10.0 and "1 kept change(s) backed off" in \
        result.quality["note"]
    assert result.quality["spread"] == 1.0 and "a second seed of the start moved FID 1.00x" in result.quality["note"]
    assert "(backed off: quality)" in result.markdown() and result.speedup is not None
    assert result.speedup_spread == (1.05, 1.2) == tuple(result.to_dict()["speedup_spread"]), "a verdict reads it"


@pytest.mark.slow
def test_a_fid_rise_within_a_second_seeds_spread_is_not_backed_off(tiny, glyphs64, monkeypatch):
    """The start with another seed scores 2x apart: a change 1.5x worse is within FID's own noise and stays kept."""
    monkeypatch.setattr(keep, "decide", lambda inc, cand, final=True: (True, 1.1, (1.05, 1.2), "kept (test)"))

    def quality(c):
        if c.optimizer_impl == "for-loop":
            return {"fid": 15.0}
        return {"fid": 20.0 if c.seed == 1 else 10.0}

    cfg = tiny.replace(loader="device", sync_every_step=True)
    result = tune(cfg, minutes=5, dataset=glyphs64, quality=quality, plan=RULE_REPLACED, progress=None,
                  space=("sync_every_step", "optimizer_impl"))
    assert not any(s.backed_off for s in result.path) and result.final_config.optimizer_impl == "for-loop"
    assert result.quality["seed_fid"] == 20.0 and result.quality["limit"] == 2.0
    assert [t["held"] for t in result.quality["tries"]] == [True] and "limit 2.00x" in result.quality["note"]


@pytest.mark.slow
def test_a_close_call_is_measured_again_and_decided_on_all_its_repeats(tiny, glyphs64, monkeypatch):
    calls = []

    def rule(inc, cand, final=True):
        calls.append((len(inc), len(cand), final))
        return (True if final else None), 1.05, (0.98, 1.1), ("kept (test)" if final else "undecided (test)")

    monkeypatch.setattr(keep, "decide", rule)  # the rule tune applies, through keep.decide_in_two
    result = tune(tiny.replace(loader="device", sync_every_step=True), minutes=5, dataset=glyphs64,
                  quality=lambda c: {"fid": 1.0}, plan=RULE_REPLACED, progress=None, space=("sync_every_step",))
    assert calls[:2] == [(3, 3, False), (6, 6, True)], "the same pairs measured again: 3 + 3 repeats decide"
    assert [s.accepted for s in result.path] == [True] and result.path[0].why == "kept (test)"


def _tuner(tiny, quality):
    from gantools.tuning.trials import TuneOptions
    from gantools.tuning.tuner import Tuner

    return Tuner(TuneOptions(cfg=tiny, minutes=5, quality=quality, plan=PLAN))


def test_tune_backs_off_past_the_limit_and_trains_the_second_seed_only_when_fid_rose(tiny):
    """The quality phase alone (no training: the quality function scores each config): the second seed of the start
    is scored once, when the first FID rose past 1.1x, and the limit stays 1.1x when that seed moved FID less."""
    scored = []

    def quality(c):
        scored.append(c)
        return {"fid": 30.0 if c.optimizer_impl == "for-loop" else 10.5 if c.seed == 1 else 10.0}

    start = tiny.replace(sync_every_step=True)
    tuner = _tuner(start, quality)
    fast = start.replace(sync_every_step=False)
    tuner.chain = [start, fast, fast.replace(optimizer_impl="for-loop")]
    tuner.kept = [Step({"sync_every_step": False}, "test", True, ""),
                  Step({"optimizer_impl": "for-loop"}, "test", True, "")]
    tuner._hold_quality()
    q = tuner.result.quality
    assert scored == [start, fast.replace(optimizer_impl="for-loop"), start.replace(seed=1), fast]
    assert q["seed_fid"] == 10.5 and q["spread"] == pytest.approx(1.05) and q["limit"] == pytest.approx(1.1)
    assert [t["held"] for t in q["tries"]] == [False, True] and [s.backed_off for s in tuner.kept] == [False, True]
    assert tuner.chain == [start, fast] and "limit 1.10x; a second seed of the start moved FID 1.05x" in q["note"]


def test_tune_trains_no_second_seed_when_the_final_fid_holds(tiny):
    scored = []

    def quality(c):
        scored.append(c)
        return {"fid": 10.5 if c.sync_every_step is False else 10.0}

    start = tiny.replace(sync_every_step=True)
    tuner = _tuner(start, quality)
    tuner.chain = [start, start.replace(sync_every_step=False)]
    tuner.kept = [Step({"sync_every_step": False}, "test", True, "")]
    tuner._hold_quality()
    assert scored == tuner.chain and "seed_fid" not in tuner.result.quality and tuner.result.quality["held"]
    assert "(1.05x, limit 1.10x)" in tuner.result.quality["note"]


def test_tune_measures_a_close_call_again_only_while_time_is_left(tiny, monkeypatch):
    """`Tuner._try` with the measuring replaced: a close call (faster on the median, lost a repeat) is measured
    again and decided on all six repeats; with no time left for that it is not kept."""
    from gantools.measuring.turns import Measured
    from gantools.tuning.space import Candidate

    start = tiny.replace(sync_every_step=True)
    tuner = _tuner(start, False)
    measures = []

    def runs(name, values):
        return Measured(subject=None, warmup_s=0.0, images_per_sec_runs=list(values))

    def measure(contenders, configs):
        measures.append(configs)
        return {"incumbent": runs("incumbent", [100, 100, 100]), "candidate": runs("candidate", [110, 120, 130])}
    monkeypatch.setattr(tuner.trials, "measure_candidate", lambda inc, cfg, inc_cfg: (
        {"incumbent": runs("incumbent", [100, 100, 100]), "candidate": runs("candidate", [120, 90, 130])}, None))
    monkeypatch.setattr(tuner.trials, "measure", measure)
    monkeypatch.setattr(tuner.trials, "discard", lambda trainer: None)
    tuner.trials.measure_s = 1.0
    step = tuner._try(Candidate({"sync_every_step": False}, "test"), start, 1.0)
    assert len(measures) == 1 and step.accepted and "5 of 6 repeats" in step.why
    assert step.images_per_sec == 120 and tuner.chain == [start, start.replace(sync_every_step=False)]
    tuner = _tuner(start, False)
    monkeypatch.setattr(tuner.trials, "measure_candidate", lambda inc, cfg, inc_cfg: (
        {"incumbent": runs("incumbent", [100, 100, 100]), "candidate": runs("candidate", [120, 90, 130])}, None))
    monkeypatch.setattr(tuner.trials, "discard", lambda trainer: None)
    tuner.trials.measure_s, tuner.budget.deadline = 1.0, 0.0
    step = tuner._try(Candidate({"sync_every_step": False}, "test"), start, 1.0)
    assert not step.accepted and step.why.endswith("no time left to measure it again") and len(tuner.chain) == 1


def test_the_budget_reserves_every_quality_run_a_function_says_it_trains_and_nothing_it_holds(tiny):
    """After the search come the quality runs (the start, the final, the start with a second seed) and the final
    speed check: each run costed at its measured speed, warm-up and scoring time; a run the quality function already
    holds (`train_images` 0, as `reconcile.scores_from` says of a config the notebook trained) costs nothing; a
    function that says nothing is taken as quick."""
    from gantools.tuning.trials import SCORE_S

    start = tiny.replace(sync_every_step=True)
    fast = start.replace(sync_every_step=False)

    def quality(c):
        return {"fid": 10.0}

    quality.train_images = lambda c: 0 if c == start else 1000
    tuner = _tuner(start, quality)
    tuner.trials.speed.update({key(start): 100.0, key(fast): 200.0})
    tuner.trials.warmup_s.update({key(start): 2.0, key(fast): 3.0})
    tuner.trials.measure_s = 4.0
    final, seed = 3.0 + 1000 / 200 + SCORE_S, 5.0 + 1000 / 100 + SCORE_S  # the seed: the start's speed, 5 s warm-up
    assert tuner.budget.reserve(start, fast) == pytest.approx(final + seed + 4.0)
    assert _tuner(start, lambda c: {"fid": 10.0}).budget.reserve(start, fast) == pytest.approx(3 * 1.0)
    assert _tuner(start, False).budget.reserve(start, fast) == 0.0


def _tune_whose_quality_runs_take(seconds, fake_clock, monkeypatch, tiny, glyphs64, says_what_it_trains):
    """A tune on the fake clock: every candidate kept, each measurement 4 s, each quality run of a config other than
    the start `seconds` (the start's scores held, as a notebook's side-by-side run holds them); the final FID 1.5x
    the start's, so the second seed of the start is trained, 2x apart: nothing is backed off."""
    monkeypatch.setattr(keep, "decide", lambda inc, cand, final=True: (True, 1.1, (1.05, 1.2), "kept (test)"))
    measurements_take(4.0, fake_clock, monkeypatch)
    cfg = tiny.replace(loader="device", sync_every_step=True)

    def quality(c):
        if c == cfg:
            return {"fid": 10.0, "classes_covered": 10, "classes": 10}
        fake_clock.advance(seconds)
        return {"fid": 20.0 if c.seed == 1 else 15.0, "classes_covered": 10, "classes": 10}

    if says_what_it_trains:
        quality.train_images = lambda c: 0 if c == cfg else 64
    return tune(cfg, minutes=0.75, dataset=glyphs64, quality=quality, plan=RULE_REPLACED, progress=None,
                space=("sync_every_step", "optimizer_impl"))


@pytest.mark.slow
def test_tunes_budget_covers_its_quality_runs_and_final_check(tiny, glyphs64, fake_clock, monkeypatch):
    """Quality runs that take as long as the budget estimates (scoring, `SCORE_S`): the search stops early enough
    for the final's run, the second seed's and the final check, and the whole tune ends inside its 45 s."""
    from gantools.tuning.trials import SCORE_S

    result = _tune_whose_quality_runs_take(SCORE_S, fake_clock, monkeypatch, tiny, glyphs64, True)
    assert result.ended.startswith("time: "), result.ended
    assert "seed_fid" in result.quality and not any(s.backed_off for s in result.path)
    assert result.seconds["second seed"] >= SCORE_S and result.seconds["reserved"] >= 2 * SCORE_S
    assert result.elapsed_s <= 45, result.summary()
    assert "past the" not in result.summary()


@pytest.mark.slow
def test_a_tune_past_its_budget_says_what_took_the_time(tiny, glyphs64, fake_clock, monkeypatch):
    """A quality function that trains without saying so (no `train_images`) is reserved a second a run; its runs
    take 20 s each, so tune ends past its budget, and the summary says so truly: what the search left, what the
    phases after it took, the second seed's share; nothing was backed off, so nothing says it was."""
    result = _tune_whose_quality_runs_take(20.0, fake_clock, monkeypatch, tiny, glyphs64, False)
    summary = result.summary()
    line = next((x for x in summary.splitlines() if x.startswith("time: ")), summary)
    over = result.elapsed_s - 45
    assert over > 0 and f"{over:.0f} s past the 0.75-minute budget" in line
    assert f"the search left {result.seconds['left']:.0f} s" in line and "the quality check" in line
    assert f"of which a second seed of the start {result.seconds['second seed']:.0f} s" in line
    assert "back" not in line, line


OUT_OF_MEMORY = Failure("OutOfMemory: out of cuda memory at step 1", out_of_memory=True)


def _measuring(tuner, monkeypatch, failure):
    """`tuner` with its measuring replaced: `failure(cfg)` rejects the candidate, or where it is None, the candidate
    is faster than the incumbent in every repeat. Returns the list of configs it is asked to measure."""
    from gantools.measuring.turns import Measured

    asked = []

    def measure_candidate(incumbent, cfg, inc_cfg):
        asked.append(cfg)
        if failure(cfg) is not None:
            return None, failure(cfg)
        return {name: Measured(subject=None, warmup_s=0.0, images_per_sec_runs=runs)
                for name, runs in (("incumbent", [100.0] * 3), ("candidate", [110.0, 111.0, 112.0]))}, None
    monkeypatch.setattr(tuner.trials, "measure_candidate", measure_candidate)
    monkeypatch.setattr(tuner.trials, "discard", lambda trainer: None)
    tuner.trials.measure_s = 1.0
    return asked


def test_a_candidate_out_of_memory_is_measured_again_with_activation_checkpointing(tiny, monkeypatch):
    """A candidate that ran out of memory is tried once more with activation checkpointing on for both networks,
    measured against the incumbent as any candidate and kept on the same rule; its step holds the whole change and
    says memory was the limit, and neither change is offered again."""
    tuner = _tuner(tiny, False)
    asked = _measuring(tuner, monkeypatch, lambda c: OUT_OF_MEMORY if c.activation_checkpointing == "off" else None)
    step = tuner._try(Candidate({"channels_last": True}, "verdict: compute-bound"), tiny, 1.0)
    assert [(c.channels_last, c.activation_checkpointing) for c in asked] == [(True, "off"), (True, "both")]
    assert step.change == {"channels_last": True, "activation_checkpointing": "both"}
    assert step.source == "verdict: compute-bound; out of memory without activation checkpointing"
    assert step.accepted and step.why.startswith("kept: 1.11x") and step.ratio_to_start == pytest.approx(1.11)
    assert tuner.chain == [tiny, tiny.replace(channels_last=True, activation_checkpointing="both")]
    assert {key({"channels_last": True}), key(step.change)} <= tuner.tried


@pytest.mark.parametrize("again", [OUT_OF_MEMORY, Failure("ConfigError: activation_checkpointing='both': MyG has "
                                                          "no blocks gantools can checkpoint")],
                         ids=["out of memory again", "your networks without blocks"])
def test_a_candidate_that_fails_with_activation_checkpointing_too_is_rejected_with_both_reasons(tiny, monkeypatch,
                                                                                                again):
    tuner = _tuner(tiny, False)
    asked = _measuring(tuner, monkeypatch, lambda c: OUT_OF_MEMORY if c.activation_checkpointing == "off" else again)
    step = tuner._try(Candidate({"channels_last": True}, "search space"), tiny, 1.0)
    assert len(asked) == 2 and not step.accepted and len(tuner.chain) == 1
    assert step.change == {"channels_last": True, "activation_checkpointing": "both"}
    assert step.why == f"rejected: {OUT_OF_MEMORY}; with activation checkpointing: {again}"


@pytest.mark.parametrize("start, change, failure", [
    ("off", {"channels_last": True}, Failure("your networks failed with this change: ValueError: bad shape")),
    ("off", {"compile": "default"}, OUT_OF_MEMORY),  # validation refuses checkpointing with torch.compile
    ("both", {"channels_last": True}, OUT_OF_MEMORY)], ids=["another failure", "with compile", "already on"])
def test_only_out_of_memory_is_measured_again_where_activation_checkpointing_is_valid_and_off(tiny, monkeypatch,
                                                                                              start, change, failure):
    start = tiny.replace(activation_checkpointing=start)
    tuner = _tuner(start, False)
    asked = _measuring(tuner, monkeypatch, lambda c: failure)
    step = tuner._try(Candidate(change, "search space"), start, 1.0)
    assert len(asked) == 1 and step.change == change and step.why == f"rejected: {failure}"


def test_lazy_penalties_are_offered_only_where_a_zero_centred_penalty_runs_every_step(tmp_path):
    """R1 and R2 every D step: one candidate makes each penalty that runs every step lazy, at StyleGAN2's interval;
    none where no penalty runs every step, and none where the space keeps to the speed knobs."""
    from gantools import preset
    from gantools.core.losses import LAZY_INTERVAL
    from gantools.doctor.findings import penalties as penalty_rules
    from gantools.tuning.space import PRIOR

    cpu, r3gan = torch.device("cpu"), preset("r3gan", out_dir=str(tmp_path))

    def lazy(cfg, space=None):
        return [c for c in search_space(cfg, cpu, space)[0] if {"r1_interval", "r2_interval"} & set(c.change)]
    [both] = lazy(r3gan)
    assert both.change == {"r1_interval": LAZY_INTERVAL, "r2_interval": LAZY_INTERVAL} == {"r1_interval": 16,
                                                                                          "r2_interval": 16}
    assert both.prior == PRIOR["r1_interval"][0] and penalty_rules.LAZY_INTERVAL == LAZY_INTERVAL
    r3gan.replace(**both.change).validate()
    assert [c.change for c in lazy(r3gan.replace(r1_interval=4))] == [{"r2_interval": 16}], "R1 is lazy already"
    assert [c.change for c in lazy(TrainConfig(r1_gamma=10.0))] == [{"r1_interval": 16}]
    for cfg in (TrainConfig(), r3gan.replace(r1_interval=16, r2_interval=16), TrainConfig(loss="wgan-gp")):
        assert lazy(cfg) == []
    assert lazy(r3gan, space=speed_knobs()) == [], "the speed knobs alone keep every GAN setting"


def test_tune_starts_from_the_r3gan_preset_and_holds_its_lazy_penalties_to_fid(tmp_path, monkeypatch):
    """From `preset('r3gan')`, with the measuring and the scoring replaced: every candidate is a valid config; one
    out of memory is not tried again with activation checkpointing (R3GAN has no blocks to checkpoint); the lazy
    candidate is kept when faster, not offered again, and backed off when it costs FID past the limit."""
    from gantools import preset
    from gantools.tuning.space import checkpointed

    start = preset("r3gan", out_dir=str(tmp_path / "run"))
    candidates, _ = search_space(start, torch.device("cpu"))
    for cand in candidates:
        start.replace(**cand.change).validate()
    assert checkpointed(start, Candidate({"channels_last": True}, "search space")) is None
    tuner = _tuner(start, lambda c: {"fid": 30.0 if c.r1_interval > 1 else 10.5 if c.seed == 1 else 10.0})
    asked = _measuring(tuner, monkeypatch, lambda c: OUT_OF_MEMORY if c.channels_last else None)
    step = tuner._try(Candidate({"channels_last": True}, "search space"), start, 1.0)
    assert len(asked) == 1 and step.why == f"rejected: {OUT_OF_MEMORY}"
    lazy = next(c for c in candidates if "r1_interval" in c.change)
    assert tuner._try(lazy, start, 1.0).accepted and tuner.chain[-1].r2_interval == 16
    assert not any("r1_interval" in c.change for c in search_space(tuner.chain[-1], torch.device("cpu"))[0])
    tuner._hold_quality()
    assert tuner.chain == [start] and tuner.kept[0].backed_off and tuner.result.quality["held"]


def test_tune_from_the_command_line_starts_from_a_preset(monkeypatch, capsys):
    """`gantools tune --preset r3gan` hands tune the preset, its flags winning, and the default space (the lazy
    penalties' intervals in it); --tune-batch-size adds batch_size to that space."""
    from gantools import preset
    from gantools.tuning import autotune
    from gantools.tuning.space import default_space

    given = []

    class Result:
        stopped = False

        def summary(self):
            return "tuned"

    def fake_tune(cfg, minutes, **kwargs):
        given.append((cfg, kwargs["space"]))
        return Result()
    monkeypatch.setattr(autotune, "tune", fake_tune)
    assert main(["tune", "--preset", "r3gan", "--minutes", "1", "--ngf", "16"]) == 0
    assert main(["tune", "--preset", "r3gan", "--minutes", "1", "--tune-batch-size"]) == 0
    assert given == [(preset("r3gan", ngf=16), None), (preset("r3gan"), default_space(batch_size=True))]
    assert {"r1_interval", "r2_interval", "batch_size"} <= set(given[1][1]) and "tuned" in capsys.readouterr().out


class OutOfMemoryAbove(BatchFreeG):
    """Your own generator, which runs out of memory training above a batch of 16 (what a GPU does at some batch size;
    the sample grid's 64 images, drawn without gradients, still fit)."""

    calls = 0
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def forward(self, z):
        self.calls += 1
        if z.shape[0] > 16 and torch.is_grad_enabled():
            raise self.error
        return super().forward(z)


@pytest.mark.slow
@pytest.mark.parametrize("error", [None, RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED")],
                         ids=["OutOfMemoryError", "cuDNN's allocation failure"])
def test_your_own_networks_and_candidates_that_raise(tiny, small_pngs, error):
    """Your G and D (copied for every run: yours stay untouched), a bigger batch that runs out of memory (as torch
    says it, or as cuDNN does; tried again with activation checkpointing, which your networks without blocks
    refuse): rejected with its reasons; the device loader for a folder, whose cache may not fit the device, left out
    with its reason and loader='auto' tried instead; and the loop goes on."""
    g, d = OutOfMemoryAbove(), BatchFreeD()
    if error is not None:
        g.error = error
    before = weights(g), weights(d)
    cfg = tiny.replace(dataset="folder", data_path=str(small_pngs), sync_every_step=True)
    result = tune(cfg, minutes=5, generator=g, discriminator=d, plan=RULE_REPLACED,
                  progress=None, quality=lambda c: {"fid": 1.0}, space=("batch_size", "loader", "sync_every_step"))
    # the space's own order, unless the profile measured the step data-bound (a busy machine's wait): its fix,
    # loader='auto', then goes first; each step is found by what it changed, so neither order decides the verdict
    steps = {next(iter(step.change)): step for step in result.path}
    assert len(result.path) == 3 and {"batch_size", "loader", "sync_every_step"} == set(steps)
    batch, auto, sync = steps["batch_size"], steps["loader"], steps["sync_every_step"]
    assert batch.change == {"batch_size": 32, "lr_g": pytest.approx(2e-4 * math.sqrt(2)),
                            "lr_d": pytest.approx(2e-4 * math.sqrt(2)), "activation_checkpointing": "both"}
    assert not batch.accepted and batch.why.startswith("rejected: OutOfMemory: out of cpu memory at step 1")
    assert "; with activation checkpointing: ConfigError: " in batch.why and "no blocks" in batch.why
    assert auto.change == {"loader": "auto"} and auto.images_per_sec > 0 and not auto.why.startswith("rejected")
    assert dict(result.skipped)["loader=device"].startswith("a folder's cache may not fit the device")
    assert sync.change == {"sync_every_step": False} and sync.images_per_sec > 0, "the loop went on"
    assert result.final_config.batch_size == 16 and result.ended == "no untried candidate left"
    assert g.calls == 0, "your networks are copied for every run, never trained themselves"
    assert all(torch.equal(a, b) for a, b in zip(weights(g).values(), before[0].values(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(weights(d).values(), before[1].values(), strict=True))


@pytest.mark.slow
def test_ctrl_c_ends_tune_between_measurements_with_the_path_so_far(tiny, glyphs64, tmp_path):
    sent = []

    def interrupt(result):
        if result.path and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))  # what Ctrl-C sends, once

    result = tune(tiny.replace(loader="device"), minutes=5, dataset=glyphs64, plan=RULE_REPLACED, progress=None,
                  quality=False, on_update=interrupt)
    assert result.stopped and len(result.path) == 1 and result.ended == "stopped"
    assert "not checked" in result.quality["note"]
    assert result.final_config == (result.start_config.replace(**result.path[0].change) if result.path[0].accepted
                                   else result.start_config)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Ctrl-C is the process's again"
    assert not (tmp_path / "run" / "tune" / "trials").exists(), "measurement runs are removed"


def test_bad_input_is_refused_before_any_work(tiny, glyphs64):
    with pytest.raises(ValueError, match="only speed knobs.*not lr_g"):
        tune(tiny, space=("lr_g",))
    with pytest.raises(ValueError, match="your own dataset: pass quality=False"):
        tune(tiny, dataset=glyphs64)
    with pytest.raises(ValueError, match="minutes=0"):
        tune(tiny, minutes=0)
    with pytest.raises(ValueError, match=r"repeats=0, quality_images=-5: each must be a whole number > 0"):
        tune(tiny, plan={"repeats": 0}, quality_images=-5)


@pytest.mark.slow
def test_tune_from_the_command_line_measures_while_the_budget_holds_the_next_candidate(tmp_path, capsys, fake_clock,
                                                                                          monkeypatch):
    """Six seconds of budget, and each measurement takes four on the clock: the first candidate fits; what comes next
    (another four-second measurement, or a profile of the new incumbent, beside four kept for the final speed check)
    does not, and the search says so."""
    measurements_take(4.0, fake_clock, monkeypatch)
    path = tmp_path / "t.json"
    args = ["tune", "--minutes", "0.1", "--no-quality", "--json", str(path), "--loader", "device", "--nz", "8",
            "--ngf", "8", "--ndf", "8", "--batch-size", "16", "--out-dir", str(tmp_path / "run")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| step | change | from |" in out and "| 1 |" in out and "| 2 |" not in out
    assert "search ended: time: " in out
    assert "final config:" in out and "TrainConfig(" in out and "python -m gantools train --loader device --nz 8" in out
    saved = json.loads(path.read_text())
    assert saved["path"] and saved["start"]["config"]["loader"] == "device"
    with pytest.raises(SystemExit):
        main(["tune", "--minutes", "0"])
    assert "argument --minutes: 0 must be > 0" in capsys.readouterr().err
