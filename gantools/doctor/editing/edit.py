"""One fix's edit of one file (`Edit`): what its `Fix.plan` writes into the file's plan (`plan.of(ItsEdit)`), and how
that is made in the patch's single libcst pass over the file (`patching.edit_source`), beside every other fix's edit.
One pass, not one per fix: every edit is planned at lines of the file as the diagnosis saw it, which an earlier pass
would move.

The pass calls, on each fix's edit, libcst's own hooks by name (`visit_Call(node)`, `leave_Call(original, updated)`,
for any node type) after its own edits of that node, `statement` on each simple statement of a block, then `block`
on the block's statements; an edit records what it made in `done` (the plan's), so that its fix can name, in
`Fix.missed`, what found nothing to edit."""
from __future__ import annotations

from libcst.metadata import PositionProvider


class Edit:
    """The base does nothing; a subclass holds what its fix planned in this file, and edits it in the pass."""

    name = ""       # the fix's name, in `done` and in the patch's "by hand" lines

    def bind(self, done: set, visitor) -> None:
        """Called by the pass before it starts: `done` is the plan's record of what was edited, `visitor` the pass
        (positions of the nodes, as the diagnosis saw the file)."""
        self.done, self.visitor = done, visitor

    def prepare(self, source: str) -> None:
        """What the edit needs of the whole file before the pass (the autocast edit's device)."""

    def statement(self, original, group: list) -> list:
        """The statements that replace one simple statement of your code (`group`: as edited so far; [] removes
        it)."""
        return group

    def block(self, groups: list) -> list:
        """A block's statements, as [(original statement, [statements replacing it])]: the edit may regroup them."""
        return groups

    def __bool__(self) -> bool:
        """Whether anything is planned in this file."""
        return False

    # -- where a node is, in the file as the diagnosis saw it ---------------------------------------------------------
    def position(self, node) -> tuple | None:
        try:
            pos = self.visitor.get_metadata(PositionProvider, node)
        except KeyError:
            return None
        return pos.start.line, pos.start.column

    def lines(self, node) -> range:
        try:
            pos = self.visitor.get_metadata(PositionProvider, node)
        except KeyError:
            return range(0)
        return range(pos.start.line, pos.end.line + 1)
