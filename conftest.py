"""Notebooks run in quick mode under pytest (nbval): tiny models and a handful of steps."""
import os

os.environ.setdefault("GANTOOLS_QUICK", "1")
