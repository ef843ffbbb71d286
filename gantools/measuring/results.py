"""How a measured result is written down: one way to draw a results table and one to write megabytes, for every layer
that prints them."""


def markdown_table(head: list, rows: list[list]) -> str:
    """A Markdown table: the one way gantools draws one (cells already formatted)."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines)


def megabytes(mb: float) -> str:
    """'99 MB', or '2.5 MB' below 10 MB, where a whole number would round a difference away."""
    return f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1f} MB"
