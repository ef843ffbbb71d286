"""Process-wide state: the snapshot a script's changes are undone from, the shared Ctrl-C handler, the one-at-a-time
lock, derived seeds, and importing gantools changing nothing global."""
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from gantools import ConfigError
from gantools.core.process import ProcessSnapshot, derived_seed, exclusive, on_interrupt


def test_a_snapshot_puts_back_what_a_script_changed(tmp_path):
    argv, path, cwd = sys.argv[:], sys.path[:], os.getcwd()
    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    precision, deterministic = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    expected = torch.rand(3, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    with ProcessSnapshot():
        sys.argv[:] = ["script.py", "--flag"]
        sys.path.insert(0, str(tmp_path))
        os.chdir(tmp_path)
        torch.manual_seed(123), torch.rand(5)
        torch.set_num_threads(threads % 2 + 1)  # another count than the one it had, 1 or 2 alike
        torch.use_deterministic_algorithms(not deterministic)
        torch.backends.cudnn.benchmark = not benchmark
        torch.set_float32_matmul_precision("medium")
    assert (sys.argv, sys.path, os.getcwd()) == (argv, path, cwd)
    assert torch.get_num_threads() == threads and torch.backends.cudnn.benchmark == benchmark
    assert torch.get_float32_matmul_precision() == precision
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.equal(torch.rand(3), expected)  # the CPU RNG where it was


def test_restore_can_be_called_by_hand():
    snapshot = ProcessSnapshot()
    sys.argv.append("--extra")
    snapshot.restore()
    assert "--extra" not in sys.argv


def test_ctrl_c_calls_back_once_then_acts_as_usual():
    calls = []
    with on_interrupt(lambda signum, frame: calls.append(signum)):
        os.kill(os.getpid(), signal.SIGINT)
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a second Ctrl-C interrupts
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert calls == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_callback_may_raise_and_the_handler_is_put_back():
    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop()

    with pytest.raises(Stop):
        with on_interrupt(stop):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_handling_does_nothing_outside_the_main_thread():
    seen = []

    def run():
        with on_interrupt(lambda *a: None):
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start(), thread.join()
    assert seen == [signal.default_int_handler]


def test_a_forked_child_ignores_the_inherited_handler():
    calls = []
    with on_interrupt(lambda *a: calls.append(1)):
        pid = os.fork()
        if pid == 0:  # the child: the inherited handler returns; exit 0 shows no KeyboardInterrupt was raised
            try:
                os.kill(os.getpid(), signal.SIGINT)
                code = 0 if signal.getsignal(signal.SIGINT) is not signal.default_int_handler else 1
            except BaseException:
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and calls == []


def test_one_at_a_time_refuses_another_thread_and_lets_the_same_thread_nest():
    holding, release = threading.Event(), threading.Event()

    def hold():
        with exclusive():
            holding.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait()
    try:
        with pytest.raises(ConfigError, match="busy elsewhere"):
            with exclusive("busy elsewhere"):
                pass
    finally:
        release.set()
        thread.join()
    with exclusive(), exclusive():  # reentrant in one thread
        pass


def test_derived_seeds_differ_by_purpose_and_run():
    assert derived_seed(0, "noise") == derived_seed(0, "noise")
    assert len({derived_seed(0, "noise"), derived_seed(0, "modules"), derived_seed(1, "noise")}) == 3
    assert 0 <= derived_seed(7, "x") < 2**63


def test_importing_gantools_changes_nothing_global():
    """gc callbacks, signal handlers and torch's flags (the environment is profiling's, tested there)."""
    code = ("import gc, signal, torch\n"
            "now = lambda: (list(gc.callbacks), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), "
            "torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)\n"
            "before = now()\n"
            "import gantools, gantools.cli, gantools.core.trainer, gantools.core.process, gantools.core.data\n"
            "print(before == now())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9: one TF32 API")
def test_a_snapshot_undoes_a_script_that_set_tf32_through_the_per_backend_api():
    """A script following torch's deprecation notice writes `fp32_precision` strings; left behind, they make the
    legacy reads of the next run in this process (`get_float32_matmul_precision`, `cudnn.allow_tf32`) raise."""
    precision = torch.get_float32_matmul_precision()
    with ProcessSnapshot():
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()  # what the next run would meet without the restore
    assert torch.get_float32_matmul_precision() == precision and torch.backends.cudnn.allow_tf32


def test_a_forked_worker_that_got_the_ctrl_c_prints_no_tracebacks():
    """A DataLoader worker gets the terminal's Ctrl-C with its parent; its threads then fail as the parent goes
    (multiprocessing's fd sharer reports through sys.excepthook): noise after a clean stop, so the worker goes quiet.
    Before the Ctrl-C it prints as usual."""
    with on_interrupt(lambda *a: None):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.close(r)
                sys.stderr = os.fdopen(w, "w", buffering=1)
                for when in ("before", "after"):
                    try:
                        raise ValueError(f"{when} the Ctrl-C")
                    except ValueError:
                        sys.excepthook(*sys.exc_info())
                    if when == "before":
                        os.kill(os.getpid(), signal.SIGINT)
                sys.stderr.flush()
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        with os.fdopen(r) as pipe:
            printed = pipe.read()
    assert "ValueError: before the Ctrl-C" in printed and "after the Ctrl-C" not in printed, printed
    assert sys.excepthook is sys.__excepthook__  # the parent's own hooks untouched
