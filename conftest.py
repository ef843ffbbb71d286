"""Notebooks run in quick mode under pytest (nbval): tiny models and a handful of steps. With pytest-xdist
(`pytest -n 2 --dist loadfile`: each test file, and each notebook's cells, on one worker) workers share the cores."""
import os
import warnings

os.environ.setdefault("GANTOOLS_QUICK", "1")


def pytest_configure(config):
    """In the process that starts pytest-xdist's workers, before it starts them: give each worker its share of the
    cores as OMP_NUM_THREADS, which the workers and their notebook kernels inherit (torch reads it at import), and
    fill the feature classifier's cache that FID scores read, so two workers never both train it and overwrite each
    other's. Tests that start processes of their own (torchrun, the import checks) set their own counts."""
    workers = len(config.getoption("tx", None) or [])  # xdist's own test for running distributed
    if workers < 2 or hasattr(config, "workerinput") or config.getoption("collectonly"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
    try:
        from gantools.core.metrics import load_classifier

        load_classifier("glyphs", 32, 1, device="cpu")
    except Exception as e:  # each worker trains its own where this one failed: slower, still correct
        warnings.warn(f"could not fill the feature classifier's cache before the workers started: {e}",
                      stacklevel=1)
