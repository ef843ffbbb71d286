"""Whole-step CUDA graphs (`cuda_graphs=True`, core/graphed_step.py). A CPU cannot capture, so here the capture is
replaced by one that replays by running the step: everything else runs as on a GPU (warm-up steps, the static
index tensor copied before each replay, the batch gathered inside the step from the static indices, the recapture
after a restore), and training through it must equal training without it, step for step. The switch itself is
refused on a CPU with one clear line, and so is every setting a replay could not honour."""
import pytest
import torch

from gantools import TrainConfig
from gantools.core.graphed_step import GraphedStep
from gantools.core.trainer import Trainer
from gantools.errors import ConfigError

SMALL = dict(image_size=32, channels=1, dataset="glyphs", ngf=8, ndf=8, nz=16, batch_size=16, steps=7, log_interval=1,
             sample_interval=0, checkpoint_interval=0, device="cpu", seed=5, loader="device")

pytestmark = pytest.mark.usefixtures("one_thread")


class ReplayByRunning:
    """A capture for a CPU: records nothing, and each replay runs the step (reading the static inputs)."""

    def __init__(self):
        self.captures, self.replays = 0, 0

    def __call__(self, run, generator, device):
        self.captures += 1

        def replay():
            self.replays += 1
            run()
        return replay


def _trained(cfg, graphed: bool):
    trainer = Trainer(cfg)
    capture = ReplayByRunning()
    if graphed:
        trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, capture)
    history = trainer.fit()
    values = [[r[k] for k in ("loss_d", "loss_g", "d_real", "d_fake", "penalty")] for r in history.records]
    weights = [p.detach().clone() for net in (trainer.generator, trainer.discriminator) for p in net.parameters()]
    return trainer, capture, values, weights


@pytest.mark.parametrize("changes", [dict(), dict(d_steps=2, hflip=True, ema_decay=0.9),
                                     dict(conditional=True, precision="bf16", channels_last=True),
                                     dict(loss="wgan-gp", d_norm="layer", grad_accum_steps=2)])
def test_a_graphed_step_trains_as_the_eager_one_does_step_for_step(tmp_path, changes):
    cfg = TrainConfig(**SMALL, **changes, optimizer_impl="fused")
    _, _, eager_values, eager_weights = _trained(cfg.replace(out_dir=str(tmp_path / "eager")), False)
    trainer, capture, values, weights = _trained(cfg.replace(out_dir=str(tmp_path / "graphed")), True)
    assert capture.captures == 1 and capture.replays == SMALL["steps"] - trainer.graphed.warmup
    for step, (got, expected) in enumerate(zip(values, eager_values, strict=True)):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), f"step {step + 1}"
    for got, expected in zip(weights, eager_weights, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_replay_against_eager_is_compared_step_by_step_and_weight_by_weight():
    from gantools.speed.replay import replay_matches_eager

    same = replay_matches_eager(TrainConfig(**SMALL), steps=6, capture=ReplayByRunning())
    assert same == {"steps": 6, "max_loss_diff": 0.0, "max_weight_rel_diff": 0.0, "matches": True}

    def off_by_one_step(run, generator, device):  # a broken replay: runs the step twice
        return lambda: (run(), run())
    broken = replay_matches_eager(TrainConfig(**SMALL), steps=6, capture=off_by_one_step)
    assert not broken["matches"] and broken["max_loss_diff"] > 1e-3


def test_a_restored_state_drops_the_graph_and_captures_again_after_fresh_warm_up(tmp_path):
    trainer = Trainer(TrainConfig(**SMALL, out_dir=str(tmp_path)))
    capture = ReplayByRunning()
    trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, capture)
    trainer.fit(5)  # 3 eager steps, then a capture and 2 replays
    assert (capture.captures, capture.replays) == (1, 2)
    with trainer.unchanged():  # puts the optimizers' state back as new tensors: the graph would hold the old ones
        pass
    trainer.fit(5)
    assert (capture.captures, capture.replays) == (2, 4)  # 3 eager steps again, a new capture, 2 replays


def test_the_graphed_step_copies_its_batches_indices_and_nothing_else_before_a_replay(tmp_path):
    from gantools.measuring.host_budget import counting

    trainer = Trainer(TrainConfig(**SMALL, out_dir=str(tmp_path)))
    # a replay the host does not see
    trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, lambda run, gen, device: lambda: None)
    trainer.fit(4)  # warm-up and capture done
    with counting(trainer.device) as budget:
        for _ in range(3):
            trainer._guarded_step()  # fit()'s step: its batches' indices fetched, then the graph replayed
    assert budget.totals["launches"] == 3 and [op for op, _, _ in budget.where("launches")] == ["copy_"]
    assert budget.totals["syncs"] == budget.totals["cpu_reads"] == 0


def test_cuda_graphs_are_refused_on_a_cpu_with_what_to_do():
    with pytest.raises(ConfigError) as refused:
        TrainConfig(**{**SMALL, "loader": "dataloader"}, cuda_graphs=True).validate()
    text = str(refused.value)
    assert "cuda_graphs=True: it captures CUDA work, and device='cpu' is cpu here: it needs a CUDA GPU" in text
    assert "use loader='device'" in text


@pytest.mark.parametrize("changes, reason", [
    (dict(compile="default"), "both capture graphs"),
    (dict(sync_every_step=True), "a host sync a capture prohibits"),
    (dict(optimizer_impl="foreach"), "must be capturable fused Adam"),
    (dict(r1_gamma=1.0, r1_interval=4, d_norm="layer"), "runs on some steps only"),
    (dict(lr_schedule="cosine"), "replays the rate it captured"),
    (dict(on_nonfinite="skip"), "replacing the optimizers' state"),
    (dict(activation_checkpointing="both"), "which a capture prohibits"),
    (dict(drop_last=False), "last, short batch changes the shapes"),
])
def test_settings_a_replay_could_not_honour_are_refused_by_name(changes, reason):
    with pytest.raises(ConfigError, match=reason):
        TrainConfig(**SMALL, cuda_graphs=True, **changes).validate()


def test_a_cuda_graph_optimizer_is_fused_and_capturable(tmp_path):
    from gantools.core.trainer import make_optimizer

    opt = make_optimizer(torch.nn.Linear(2, 1).parameters(), TrainConfig(device="cuda", cuda_graphs=True), 1e-3)
    assert opt.defaults["fused"] is True and opt.defaults["capturable"] is True


def test_the_host_budget_of_a_graphed_step_is_its_index_copies_and_one_graph_launch(tmp_path):
    from gantools.speed.iteration_budget import count

    trainer = Trainer(TrainConfig(**SMALL, d_steps=2, out_dir=str(tmp_path)))
    trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, lambda run, gen, device: lambda: None)
    budget, _ = count(trainer, iterations=3)
    assert budget.per_iteration()["launches"] == 3  # an index copy per D step, and the replay
    assert [op for op, _, _ in budget.where("launches")] == ["copy_", "graph replay"]
    assert budget.per_iteration()["syncs"] == budget.per_iteration()["cpu_reads"] == 0


def test_a_restore_before_the_capture_restarts_the_warm_up(tmp_path):
    """A snapshot from before the optimizers had state, put back after the warm-up: capturing now would record
    Adam's first step (its zeroed moments) into every replay; the warm-up starts again instead."""
    trainer = Trainer(TrainConfig(**SMALL, out_dir=str(tmp_path)))
    capture = ReplayByRunning()
    trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, capture)
    with trainer.unchanged():
        trainer.fit(3)  # the three warm-up steps, then put back as they were: no optimizer state
    trainer.fit(4)
    assert (capture.captures, capture.replays) == (1, 1)  # three eager steps again, then the capture


def test_a_step_that_cannot_be_captured_is_one_clear_error(tmp_path):
    def refusing(run, generator, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    trainer = Trainer(TrainConfig(**SMALL, out_dir=str(tmp_path)))
    trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, refusing)
    with pytest.raises(ConfigError, match=r"could not be captured in a CUDA graph \(operation not permitted when "
                                          r"stream is capturing\); train with cuda_graphs=False"):
        trainer.fit(5)


def test_a_resumed_run_keeps_its_own_optimizer_kernels(tmp_path):
    """torch's load_state_dict takes the saved groups' flags: a run built fused (or capturable, for a graph)
    resumed from a for-loop run's checkpoint would step with for-loop kernels. The run's own groups stay."""
    first = Trainer(TrainConfig(**SMALL, optimizer_impl="for-loop", out_dir=str(tmp_path / "a")))
    first.fit(2)
    resumed = Trainer.resume(tmp_path / "a" / "checkpoint.pt", optimizer_impl="fused", out_dir=str(tmp_path / "b"))
    for opt in (resumed.opt_g, resumed.opt_d):
        assert all(group["fused"] is True and not group["foreach"] for group in opt.param_groups)
        steps = [state["step"] for state in opt.state.values()]
        assert steps and all(float(step) == 2 for step in steps)  # the moments and counters came back
