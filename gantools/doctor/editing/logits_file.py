"""The logits edit of one file (`FileEdit`), as `logits.logits_edit` finds it and as the patch's single pass makes it
(`edit.Edit`): D's final nn.Sigmoid out of its class, the BCE losses renamed to their logits form, and each node
`logits` planned (a sigmoid taken off, a read of D put through one) rewritten."""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .edit import Edit
from .sources import callee, node_key

LOGITS = "logits"
RENAMES = {"BCELoss": "BCEWithLogitsLoss", "binary_cross_entropy": "binary_cross_entropy_with_logits"}
UNWRAP, THROUGH_SIGMOID = "unwrap", "sigmoid"   # the two node edits: a sigmoid taken off, a read put through one


def is_sigmoid_module(node) -> bool:
    return isinstance(node, cst.Call) and callee(node).split(".")[-1] == "Sigmoid"


class LastSigmoid(cst.CSTVisitor):
    """The last nn.Sigmoid() call inside a class, in source order (an earlier one is a gate inside the network, as in
    squeeze-and-excitation): its position, and the node."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, cls: str):
        super().__init__()
        self.cls, self.classes, self.position, self.node = cls, [], None, None

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, node):
        self.classes.pop()

    def visit_Call(self, node):
        if self.classes and self.classes[-1] == self.cls and is_sigmoid_module(node):
            pos = self.get_metadata(PositionProvider, node).start
            self.position, self.node = (pos.line, pos.column), node


def atomic(node) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or bool(getattr(node, "lpar", ()))


def _parenthesized(node):
    return node if atomic(node) else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def rewrite(action: tuple, node):
    """A node's logits edit (`FileEdit.nodes`): a sigmoid call replaced by what it was applied to, or a value read
    from D put through `.sigmoid()`."""
    if action[0] == UNWRAP:
        inner = node.args[0].value if node.args else node.func.value
        return _parenthesized(inner) if action[1] else inner
    return cst.Call(func=cst.Attribute(value=_parenthesized(node), attr=cst.Name("sigmoid")))


@dataclass
class FileEdit(Edit):
    """The logits edit of one file, as the patch's pass makes it (`edit.Edit`)."""

    rename: bool = False
    sigmoid_class: str | None = None
    sigmoid_at: tuple | None = None   # (line, column) of the nn.Sigmoid() to remove from it
    nodes: dict = field(default_factory=dict)   # node_key -> (UNWRAP, parenthesize) or (THROUGH_SIGMOID,)
    name = LOGITS

    def __bool__(self):
        return bool(self.sigmoid_class or self.nodes or self.rename)

    # -- D's final Sigmoid and the BCE loss -----------------------------------------------------------------------
    def visit_Module(self, node):
        """D's nn.Sigmoid to remove: where `logits` placed it (a two-headed D's, by its path), else the last one its
        class builds, in source order (an earlier one is a gate inside the network, as in squeeze-and-excitation):
        only that one is removed, as at run time."""
        self.final_sigmoid, self.classes = self.sigmoid_at, []
        if self.sigmoid_class and self.final_sigmoid is None:
            last = LastSigmoid(self.sigmoid_class)
            MetadataWrapper(node, unsafe_skip_copy=True).visit(last)
            self.final_sigmoid = last.position

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.classes.pop()
        return updated

    def _in_d(self) -> bool:
        return bool(self.classes) and self.classes[-1] == self.sigmoid_class

    def _is_final_sigmoid(self, original_node) -> bool:
        return (self.final_sigmoid is not None and is_sigmoid_module(original_node)
                and self.position(original_node) == self.final_sigmoid)

    def leave_List(self, original, updated):
        return self._items(original, updated, "elements")

    def leave_Tuple(self, original, updated):
        return self._items(original, updated, "elements")

    def _items(self, original, updated, field_name):
        if not self._in_d():
            return updated
        return updated.with_changes(**{field_name: self._without_sigmoid(getattr(original, field_name),
                                                                         getattr(updated, field_name))})

    def _without_sigmoid(self, originals, items) -> list:
        """Arguments or elements without D's final nn.Sigmoid(); the line break before the closing bracket moves to
        the item now last, so the bracket keeps its place and indentation, and that item keeps its comment."""
        items = list(items)
        kept = [x for o, x in zip(originals, items, strict=True) if not self._is_final_sigmoid(o.value)]
        if len(kept) == len(items):
            return items
        self.done.add(LOGITS + ":sigmoid")
        if kept and items[-1] not in kept:
            last, gone = kept[-1], items[-1]
            closing = (gone.whitespace_after_arg if isinstance(gone, cst.Arg) else
                       gone.comma.whitespace_after if isinstance(gone.comma, cst.Comma) else None)
            if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(last.comma, cst.Comma):
                after = last.comma.whitespace_after
                if isinstance(after, cst.ParenthesizedWhitespace):
                    closing = closing.with_changes(first_line=after.first_line, empty_lines=after.empty_lines)
                kept[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=closing))
            elif not isinstance(closing, cst.ParenthesizedWhitespace):  # all on one line: no trailing comma
                kept[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return kept

    def leave_ImportAlias(self, original, updated):
        """`from torch.nn.functional import binary_cross_entropy` follows the calls it feeds."""
        if self.rename and isinstance(updated.name, cst.Name) and updated.name.value in RENAMES:
            self.done.add(LOGITS + ":loss")
            return updated.with_changes(name=cst.Name(RENAMES[updated.name.value]))
        return updated

    def leave_Attribute(self, original, updated):
        """`nn.BCELoss(...)`, `F.binary_cross_entropy(...)`, and either named without a call (`loss = nn.BCELoss`)."""
        if self.rename and updated.attr.value in RENAMES:
            self.done.add(LOGITS + ":loss")
            updated = updated.with_changes(attr=cst.Name(RENAMES[updated.attr.value]))
        return self._node(original, updated)

    def leave_Call(self, original, updated):
        if self._in_d() and not callee(updated).endswith(".append"):
            updated = updated.with_changes(args=self._without_sigmoid(original.args, updated.args))
        if self.rename and isinstance(updated.func, cst.Name) and updated.func.value in RENAMES:
            self.done.add(LOGITS + ":loss")  # the name imported from torch.nn(.functional), renamed there too
            updated = updated.with_changes(func=cst.Name(RENAMES[updated.func.value]))
        return self._node(original, updated)

    def leave_Name(self, original, updated):
        return self._node(original, updated)

    def leave_Subscript(self, original, updated):
        return self._node(original, updated)

    def _node(self, original, updated):
        """After the node's own edits, the logits edit planned at it (`rewrite`)."""
        if not self.nodes:
            return updated
        try:
            key = node_key(original, self.visitor.get_metadata(PositionProvider, original))
        except KeyError:
            return updated
        if key in self.nodes:
            self.done.add(f"{LOGITS}:{key}")
            updated = rewrite(self.nodes[key], updated)
        return updated

    def statement(self, original, group):
        """`layers.append(nn.Sigmoid())` whose Sigmoid is D's final one goes."""
        if self._in_d() and any(isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                                and callee(small.value).endswith(".append") and small.value.args
                                and self._is_final_sigmoid(small.value.args[0].value) for small in original.body):
            self.done.add(LOGITS + ":sigmoid")
            return []
        return group
