"""Counting what torch.compile did (measuring.compile_counts) and the rule that says when compiling pays back
(conclusions.compile_payback). The compiled functions use dynamo's "eager" backend: the counts come from dynamo
(capture, guards, breaks), so the test needs no C++ compiler and runs in a second."""
import torch

from gantools.measuring.compile_counts import compile_counters, counting
from gantools.workbook import conclusions


def test_a_first_call_compiles_and_a_repeat_compiles_nothing():
    f = torch.compile(lambda x: torch.relu(x) * 2, backend="eager")
    with counting() as first:
        f(torch.randn(4))
    with counting() as again:
        f(torch.randn(4))
    assert first.compiled_graphs == 1 and first.recompiles == 0 and first.graph_breaks == 0
    assert (again.compiled_graphs, again.recompiles) == (0, 0)


def test_a_failed_guard_is_a_recompile_with_dynamos_reason():
    f = torch.compile(lambda x: x.sin().sum(), backend="eager")
    f(torch.randn(3))
    with counting() as count:
        f(torch.randn(3, requires_grad=True))  # the guard on requires_grad fails: compiled again
    assert count.recompiles == 1 and count.compiled_graphs == 1
    assert len(count.recompile_reasons) == 1 and "requires_grad" in count.recompile_reasons[0]


def test_each_recompile_counts_once_however_many_cached_versions_failed_their_guards():
    f = torch.compile(lambda x: x.sin().sum(), backend="eager")
    f(torch.randn(3))
    with counting() as count:
        f(torch.randn(3, requires_grad=True))   # the one cached version fails: a recompile
        f(torch.randn(5))                        # both cached versions fail (their shape): one recompile still
    assert count.recompiles == 2 and count.compiled_graphs == 2 and len(count.recompile_reasons) == 2
    assert all("mismatch" in reason for reason in count.recompile_reasons)  # dynamo's first failed guard each


def test_a_graph_break_is_counted_with_its_reason():
    def logged(x):
        y = x.cos()
        torch._dynamo.graph_break()  # what a print or .item() inside a forward does
        return y + 1

    f = torch.compile(logged, backend="eager")
    with counting() as count:
        f(torch.randn(5))
    assert count.graph_breaks == 1 and count.compiled_graphs == 2 and len(count.break_reasons) == 1
    assert compile_counters()["graph_breaks"] >= 1


def test_compile_pays_back_after_compile_time_over_time_saved_per_step():
    said = conclusions.compile_payback(30.0, 0.5, 0.4, paired=(1.1, 1.4))
    assert said.keep and "pays back after 300 steps" in said.text and "2.5 min" in said.text


def test_compile_never_pays_back_without_steps_measured_faster():
    slower = conclusions.compile_payback(30.0, 0.5, 0.6, paired=(0.7, 0.9))
    assert not slower.keep and "does not pay back here" in slower.text
    for paired in ((0.9, 1.2), None):  # not measured faster: no payback shown, nor "never"
        said = conclusions.compile_payback(30.0, 0.5, 0.4, paired=paired)
        assert not said.keep and "no payback measured" in said.text and "never" not in said.text
