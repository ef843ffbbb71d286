"""Quick mode (GANTOOLS_QUICK=1): tiny runs, so the tests and nbval execute every notebook in seconds. A leaf module
(it imports nothing from gantools): the workbook, the benchmark, tune, the quality meter and the panel all read it
without importing each other."""
import os

QUICK = os.environ.get("GANTOOLS_QUICK", "") not in ("", "0")
