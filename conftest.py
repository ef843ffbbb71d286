"""Notebooks run in quick mode under pytest (nbval): tiny models and a handful of steps. With pytest-xdist
(`pytest -n 2 --dist loadfile`: each test file, and each notebook's cells, on one worker) workers share the cores.
The files go to the workers longest first (`HEAVY_FILES`), so that neither worker is left alone with a long file at
the end."""
import os
import warnings

os.environ.setdefault("GANTOOLS_QUICK", "1")

# The files that take longest in `make test`: seconds of their tests in one worker, measured in one run on the 2-core
# machine under a load average of about 5 (so about twice a quiet machine's; only their order matters). xdist hands
# them out first, longest first, then every other file as xdist orders them (most tests first), so that neither worker
# is left alone with a long file at the end. Only the order changes, never a verdict: a file missing here, or a figure
# gone stale, costs wall time at most.
HEAVY_FILES = {
    "tests/test_doctor_shapes.py": 249, "tests/test_gpu_evidence.py": 190, "tests/test_browser.py": 184,
    "tests/test_data_parallel.py": 137, "notebooks/09_compiler.ipynb": 110, "tests/test_doctor_try.py": 109,
    "tests/test_bench.py": 105, "tests/test_check.py": 74, "tests/test_charts.py": 72, "tests/test_metrics.py": 64,
    "tests/test_gan_family.py": 63, "tests/test_robustness.py": 59, "notebooks/11_modern_gan.ipynb": 53,
    "notebooks/06_your_own_gan.ipynb": 52, "tests/test_imports.py": 50, "tests/test_doctor_ddp.py": 46,
    "notebooks/10_several_gpus.ipynb": 45, "tests/test_book.py": 40,
}


def pytest_configure(config):
    """In the process that starts pytest-xdist's workers, before it starts them: give each worker its share of the
    cores as OMP_NUM_THREADS, which the workers and their notebook kernels inherit (torch reads it at import), and
    fill the feature classifier's cache that FID scores read, so two workers never both train it and overwrite each
    other's. Tests that start processes of their own (torchrun, the import checks) set their own counts."""
    workers = len(config.getoption("tx", None) or [])  # xdist's own test for running distributed
    if workers < 2 or hasattr(config, "workerinput") or config.getoption("collectonly"):
        return
    config.option.loadscopereorder = False  # the workers' collection order (pytest_collection_modifyitems) is the plan
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
    try:
        from gantools.core.metrics import load_classifier

        load_classifier("glyphs", 32, 1, device="cpu")
    except Exception as e:  # each worker trains its own where this one failed: slower, still correct
        warnings.warn(f"could not fill the feature classifier's cache before the workers started: {e}",
                      stacklevel=1)


def pytest_collection_modifyitems(config, items):
    """In each pytest-xdist worker (their collections must agree, and do: this order depends on nothing else), the
    heavy files first, longest first; the others after them in xdist's own order, most tests first. Within a file
    the tests keep their order. pytest_configure tells xdist to keep this order rather than sort by test count."""
    if not hasattr(config, "workerinput"):
        return
    files = [item.nodeid.split("::")[0] for item in items]  # xdist's loadfile unit: the file
    counts = {f: files.count(f) for f in set(files)}
    order = {f: (-HEAVY_FILES.get(f, 0), -counts[f], files.index(f)) for f in counts}
    items[:] = [item for _, item in sorted(zip(files, items, strict=True), key=lambda pair: order[pair[0]])]
