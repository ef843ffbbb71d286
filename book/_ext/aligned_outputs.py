"""Text outputs laid out in columns keep their lines; every other long line wraps (book/_static/book.css).

A reader of the book must see each line whole. Code and printed sentences wrap at the column's edge, but wrapping a
table printed as text (torch.profiler's, the doctor's phase timings) scatters its columns, so such an output is
marked `aligned-output` and scrolls sideways instead, its columns intact.
"""
from __future__ import annotations

import re

from docutils import nodes
from sphinx.transforms import SphinxTransform

# A gap of two or more spaces between characters: the padding between two columns of a table printed as text.
_COLUMN_GAP = re.compile(r"(?<=\S) {2,}(?=\S)")
_LONG = 80  # characters: a line this long may meet the column's edge on a narrow screen


def is_aligned(text: str) -> bool:
    """A table printed as text: two or more rows of three or more columns, and no long line that is not a row.

    A long line of prose (a report's explanation) wraps better than it scrolls, and the short rows of a small table
    beside it fit the column anyway; `f"{name:>9}: {ms:6.2f} ms"` pads one value and makes no table.
    """
    rows = [len(_COLUMN_GAP.findall(line)) >= 2 for line in text.splitlines()]
    long_prose = any(len(line) > _LONG and not row for line, row in zip(text.splitlines(), rows, strict=True))
    return sum(rows) >= 2 and not long_prose


class AlignedOutputs(SphinxTransform):
    """Mark the text outputs of notebook cells (myst-nb's `output` literal blocks) that are laid out in columns."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        for node in self.document.findall(nodes.literal_block):
            if "output" in node["classes"] and is_aligned(node.astext()):
                node["classes"].append("aligned-output")


def setup(app):
    app.add_transform(AlignedOutputs)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
