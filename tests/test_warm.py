"""The warm start (gantools/workbook/warm.py): trained once per machine and key, then loaded; every arm of a race
starts from its own copy; quick mode stays tiny and judges no quality; the real mode stops when G draws enough
classes, and says so when it does not get there."""
import pytest
import torch

from gantools import TrainConfig, Trainer
from gantools.errors import ConfigError
from gantools.workbook import runs, tutorial, warm

TINY = dict(nz=8, ngf=8, ndf=8, batch_size=16)


def _tensors(state: dict) -> list:
    return [v for v in state.values() if isinstance(v, torch.Tensor)]


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    return warm.warm_start("cpu", folder=tmp_path_factory.mktemp("warm"), **TINY)


def test_quick_mode_trains_a_few_steps_and_judges_nothing(start):
    assert start.steps == warm.QUICK_STEPS and not start.loaded and start.path.is_file()
    assert start.classes_covered is None and not start.judged and "quality is not judged" in start.describe()


def test_a_second_call_does_not_train_and_loads_equal_tensors(start, monkeypatch):
    monkeypatch.setattr(tutorial, "train_step", lambda *a: pytest.fail("the cached warm start was trained again"))
    again = warm.warm_start("cpu", folder=start.path.parent, **TINY)
    assert again.loaded and again.path == start.path and again.steps == start.steps
    for part in ("G", "D"):
        assert all(torch.equal(a, b)
                   for a, b in zip(_tensors(start.state[part]), _tensors(again.state[part]), strict=True))
    moments = [s["exp_avg"] for s in again.state["opt_g"]["state"].values()]
    assert moments and all(torch.equal(s["exp_avg"], m) for s, m in zip(start.state["opt_g"]["state"].values(),
                                                                          moments, strict=True))


def test_whatever_determines_a_start_names_another_cache_file(monkeypatch):
    args = dict(device=torch.device("cpu"), seed=0, d_norm="batch", min_classes=8, max_steps=4, folder="f",
                size=TINY)
    key, path = warm.cache_entry(**args)
    assert warm.cache_entry(**args) == (key, path) and key["torch"] == torch.__version__.split("+")[0]
    changed = [dict(seed=1), dict(d_norm="layer"), dict(max_steps=5), dict(size={**TINY, "ngf": 16}),
               dict(device=torch.device("meta"))]
    assert len({path, *(warm.cache_entry(**{**args, **c})[1] for c in changed)}) == 1 + len(changed)
    monkeypatch.setattr(warm, "GLYPHS_VERSION", -1)  # other data: the same readable name, another digest
    assert warm.cache_entry(**args)[1] != path


def test_each_arm_gets_its_own_copy_and_training_one_leaves_the_other_and_the_start_alone(start, glyphs64):
    def endless():
        while True:
            yield from glyphs64.images.float().div(127.5).sub(1).split(16)

    a, b = start.gan("cpu", batches=endless()), start.gan("cpu", batches=endless())
    saved = {k: v.clone() for k, v in start.state["G"].items()}
    for arm in (a, b):
        assert all(torch.equal(p, saved[k]) for k, p in arm.G.state_dict().items())
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(a.G.parameters(), b.G.parameters(), strict=True))
    b_before = [p.detach().clone() for p in b.G.parameters()]
    b_moment = b.opt_g.state[next(b.G.parameters())]["exp_avg"].clone()
    tutorial.train_step(a, next(a.batches))
    assert any(not torch.equal(p, q) for p, q in zip(a.G.parameters(), b_before, strict=True)), "arm a trained"
    assert all(torch.equal(p, q) for p, q in zip(b.G.parameters(), b_before, strict=True)), "arm b moved with arm a"
    assert torch.equal(b.opt_g.state[next(b.G.parameters())]["exp_avg"], b_moment), "the arms share Adam moments"
    assert all(torch.equal(v, start.state["G"][k]) for k, v in saved.items()), "the start itself changed"


def test_an_arm_keeps_its_own_optimizer_settings_and_another_optimizer_starts_afresh(start):
    adamw = start.gan("cpu", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), batches=iter(()))
    assert adamw.opt_g.param_groups[0]["lr"] == 1e-3 and len(adamw.opt_g.state) > 0, "moments loaded, lr kept"
    sgd = start.gan("cpu", optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batches=iter(()))
    assert len(sgd.opt_g.state) == 0 and sgd.opt_g.param_groups[0]["lr"] == 0.1


def test_a_trainer_starts_from_the_warm_start_and_a_mismatched_one_is_refused(start, tmp_path, glyphs64):
    cfg = TrainConfig(**TINY, steps=2, log_interval=1, sample_interval=0, checkpoint_interval=0, loader="device",
                      out_dir=str(tmp_path / "run"))
    trainer = Trainer(cfg, dataset=glyphs64)
    start.load_into(trainer)
    assert all(torch.equal(p, start.state["G"][k]) for k, p in trainer.generator.state_dict().items())
    assert trainer.fit().summary()["steps"] == 2
    with pytest.raises(ConfigError, match="before it trains"):
        start.load_into(trainer)
    with pytest.raises(ConfigError, match="differ from the warm start"):
        start.load_into(Trainer(cfg.replace(ngf=16), dataset=glyphs64))


def test_a_start_taken_from_a_trained_run_goes_on_from_its_weights_and_moments_in_each_arm(tmp_path, glyphs64):
    """`WarmStart.of_run`: arms go on from an R3GAN run of this kernel, each with its own copy, and training the run
    further after taking it leaves the start as it was."""
    cfg = TrainConfig(architecture="r3gan", loss="rpgan", nz=8, ngf=8, ndf=8, batch_size=16, steps=2, log_interval=1,
                      sample_interval=0, checkpoint_interval=0, loader="device", ema_decay=0.5,
                      out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="has not taken a step"):
        warm.WarmStart.of_run(Trainer(cfg, dataset=glyphs64))
    run = Trainer(cfg, dataset=glyphs64)
    run.fit()
    start = warm.WarmStart.of_run(run)
    weights = {k: v.clone() for k, v in run.generator.state_dict().items()}
    averaged = {k: v.clone() for k, v in run.ema.state_dict().items()}  # what the run's scores came from
    moment = run.opt_d.state[next(run.discriminator.parameters())]["exp_avg"].clone()
    assert start.steps == 2 and start.key["architecture"] == "r3gan" and str(tmp_path / "run") in start.describe()
    run.fit(2)  # the run goes on: the start keeps the weights it was taken at
    arm = Trainer(cfg.replace(out_dir=str(tmp_path / "arm")), dataset=glyphs64)
    start.load_into(arm)
    assert all(torch.equal(p, weights[k]) for k, p in arm.generator.state_dict().items())
    assert any(not torch.equal(p, weights[k]) for k, p in run.generator.state_dict().items()), "the run trained on"
    assert torch.equal(arm.opt_d.state[next(arm.discriminator.parameters())]["exp_avg"], moment)
    assert all(torch.equal(v, averaged[k]) for k, v in arm.ema.state_dict().items()), "the arm's average is the run's"
    assert any(not torch.equal(v, weights[k.removeprefix("module.")]) for k, v in averaged.items()
               if k.removeprefix("module.") in weights), "the average differs from G, so the check above could fail"
    plain = start.gan("cpu", batches=iter(()))  # the tutorial's loop holds R3GAN's networks too
    assert all(torch.equal(p, weights[k]) for k, p in plain.G.state_dict().items())


def test_train_side_by_side_starts_every_run_from_the_start(tmp_path):
    loaded = []

    class Spy:
        def load_into(self, trainer):
            assert trainer.step == 0
            loaded.append(trainer)

    cfg = TrainConfig(**TINY, log_interval=1, sample_interval=0, loader="device", out_dir=str(tmp_path / "a"))
    trainers = runs.train_side_by_side({"a": cfg, "b": cfg.replace(out_dir=str(tmp_path / "b"))}, steps=2,
                                       chunk_steps=1, quality=False, plot=False, start=Spy())
    assert loaded == list(trainers.values())


def test_the_real_mode_stops_once_g_draws_enough_classes_and_warns_at_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(warm, "QUICK", False)
    monkeypatch.setattr(warm, "CHECK_EVERY", 1)
    covered = iter([3, 6, 9, 10])
    monkeypatch.setattr(tutorial, "score", lambda gan: {"classes_covered": next(covered), "fid": 50.0})
    reached = warm.warm_start("cpu", folder=tmp_path, verbose=False, **TINY)
    assert reached.steps == 3 and reached.classes_covered == 9 and reached.judged
    assert "quality is compared from here" in reached.describe()
    monkeypatch.setattr(tutorial, "score", lambda gan: {"classes_covered": 2, "fid": 900.0})
    with pytest.warns(UserWarning, match="max_steps=2 with its G drawing 2 of 10 classes"):
        capped = warm.warm_start("cpu", max_steps=2, folder=tmp_path, verbose=False, **TINY)
    assert capped.steps == 2 and not capped.judged and "not judged" in capped.describe()
