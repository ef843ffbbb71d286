"""How a measured result is written down: one way to draw a results table, for every layer that prints one."""


def markdown_table(head: list, rows: list[list]) -> str:
    """A Markdown table: the one way gantools draws one (cells already formatted)."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines)
