"""CUDA graphs come from two compile modes, not one: max-autotune turns them on too (torch.compile's docs). One
function decides it from the mode's own options, and every guard the step needs follows it. Runs on the CPU: the
decisions are pure, and a trainer's graphs flag stands for a GPU's."""
import threading

import pytest
import torch

from gantools import ConfigError, Trainer
from gantools.tuning import space
from gantools.core.config import COMPILE_MODES, uses_cuda_graphs
from gantools.workbook.panel import background_thread_unsafe
from gantools.core.recovery import check_compiles


def test_max_autotune_and_reduce_overhead_use_cuda_graphs_and_the_others_do_not():
    assert {m for m in COMPILE_MODES if uses_cuda_graphs(m)} == {"max-autotune", "reduce-overhead"}


def test_the_panel_offers_no_cuda_graph_mode_in_its_background_thread():
    assert set(background_thread_unsafe("compile")) == {"max-autotune", "reduce-overhead"}
    assert background_thread_unsafe("precision") == ()


def test_skipped_cuda_graphs_are_warned_about_under_max_autotune_too():
    records = [{"compiled_graphs": 4, "cudagraph_skips": 0}, {"compiled_graphs": 4, "cudagraph_skips": 2}]
    said = []
    check_compiles(records, 10, "max-autotune", lambda message, stacklevel: said.append(message))
    assert len(said) == 1 and "skipped CUDA graphs for 2" in said[0]
    check_compiles(records, 10, "default", lambda message, stacklevel: said.append(message))
    assert len(said) == 1


def test_tune_offers_max_autotune_on_cuda_only_where_check_validated_it(tiny):
    candidates, skipped = space.search_space(tiny, torch.device("cuda"), space=("compile",))
    offered = {c.change.get("compile") for c in candidates}
    refused = {what.split("=")[1]: why for what, why in skipped if what.startswith("compile=")}
    assert not offered & {"max-autotune", "reduce-overhead"}, candidates
    assert set(refused) == {"max-autotune", "reduce-overhead"} and all("validated" in w for w in refused.values())


def test_a_trainer_with_cuda_graphs_marks_each_step_and_refuses_a_background_thread(tiny, glyphs64, monkeypatch):
    trainer = Trainer(tiny.replace(steps=2, log_interval=1, sample_interval=0, checkpoint_interval=0),
                      dataset=glyphs64)
    assert trainer.stepper.cuda_graphs is False  # a CPU never uses them
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    trainer.stepper.cuda_graphs = True  # as on a GPU with compile='max-autotune'
    trainer.fit(2)
    assert len(marks) == 2
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(ConfigError, trainer.fit, 1)))
    thread.start()
    thread.join()
    assert errors and "background thread" in str(errors[0].value)
