"""Auto-tune: the workbook's loop (profile, fix, measure, keep or drop) run by gantools itself (`autotune.tune`),
over a search space (`space`), with trials (`trials`), the loop's state (`tuner`) and its result (`result`)."""
from .autotune import tune
from .result import TuneResult

__all__ = ["TuneResult", "tune"]
