"""The workbook's narration and charts, the top layer: what the notebooks import. Live plots and tables
(`display`, `chart_layout`, `chart_notes`, `grids`), the widget panel (`panel`), the plain loop taught on
(`tutorial`), conclusions drawn from a notebook's own numbers (`conclusions`, `balance`, `drift`, `reconcile`), and
the runs the notebooks share (`runs`, re-exported here: `from gantools.workbook import workbook_config`)."""
from ..quick import QUICK
from .runs import (QUICK_SIZE, baseline, load_results, quality_curve, real_size, runs_dir, save_result,
                   train_side_by_side, workbook_config)

__all__ = ["QUICK", "QUICK_SIZE", "baseline", "load_results", "quality_curve", "real_size", "runs_dir", "save_result",
           "train_side_by_side", "workbook_config"]
