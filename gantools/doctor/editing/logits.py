"""The logits edit of your source, whole or not at all: D's sigmoid removed where D applies it, each BCE loss fed by D
switched to its logits form, and every other value your code takes from D's output (a logged D(x), an accuracy, a
threshold) put through a sigmoid, so each number means what it meant. Half of it would train on another loss, so
each part is first found in your code (`logits_edit`); where one cannot be found or followed, nothing is edited and
the lines are listed to change by hand.

Where D applies its sigmoid, in a form the edit removes:
- a final nn.Sigmoid its class builds (an nn.Sequential's argument, a list's element, `layers.append(...)`), or one
  kept as an attribute and called on the value its forward returns;
- `torch.sigmoid(x)`, `F.sigmoid(x)` or `x.sigmoid()` on the value D's forward (or a plain function D) returns,
  directly or through the variable its last assignment names;
- of a two-headed D (`return validity, label`, unpacked by each call: `validity, label = discriminator(x)`), the same
  on the one value its losses take: the nn.Sigmoid the run saw make it, found where its class builds it by its path
  (`self.adv_layer = nn.Sequential(nn.Linear(...), nn.Sigmoid())`: adv_layer.1), wherever D's last module is.

D's output is followed through the variables of the function it is assigned in, and through shape-only ops (view,
squeeze, indexing, .float(): they commute with an elementwise sigmoid). A BCE loss is followed from where it is
built to its calls; each one's input must be D's output, or a parameter of the function the call is in (a loss helper,
`def adversarial_loss(y_hat, y)`) that every call of that function, found in your files, passes D's output."""
from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper

from ..watching.frames import cell_label, shown, yours
from .logits_file import LOGITS, RENAMES, THROUGH_SIGMOID, UNWRAP, FileEdit, LastSigmoid, atomic, is_sigmoid_module
from .sources import SHAPE_OPS, Part, Source, built_path, callee, code, handed, move_of, passed, returned, unpacked

SIGMOIDS = frozenset({"sigmoid", "expit"})


@dataclass
class LogitsEdit:
    """The whole edit (`files`), or why it cannot be made (`why_not`); `sites` lists its lines either way."""

    files: dict = field(default_factory=dict)   # absolute path -> FileEdit
    sites: list = field(default_factory=list)   # (file, line, what to do there)
    why_not: str = ""

    def by_hand(self) -> str:
        """The lines to change, for a finding or `--patch` to show when the doctor cannot make the edit."""
        out = [f"D's sigmoid and its BCE losses change together, and the doctor cannot make all of it ({self.why_not})"
               ": change these lines by hand"]
        for file, line, what in sorted(set(self.sites)):
            out.append(f"  {shown(file)}:{line}: {linecache.getline(file, line).strip()}    # {what}")
        return "\n".join(out)


# -- finding the whole edit ------------------------------------------------------------------------------------------
def logits_edit(report, ctx) -> LogitsEdit:
    """The logits edit of your files for this diagnosis, whole, or the lines to change by hand and why not.

    Args:
        report: the diagnosis (D's class, the file it is defined in, its call sites).
        ctx: what the fixes know of the run (`fixes.Context`: D's final nn.Sigmoid, if any).

    Returns:
        The `LogitsEdit`: per file, the edits to make (none when `why_not` says why they cannot all be made).
    """
    finder = _Finder(report, ctx)
    finder.run()
    edit = finder.edit
    edit.why_not = "; ".join(dict.fromkeys(finder.problems))
    if edit.why_not:
        edit.files = {}
    return edit


class _Finder:
    def __init__(self, report, ctx):
        self.d = report.models.get("D", {})
        self.ctx, self.edit, self.problems = ctx, LogitsEdit(), []
        at = self.d.get("call_sites") or []
        script = os.path.abspath(report.source)  # not a file for a loop run from Python: then D's call sites
        files = [self.d.get("defined_in"), script if os.path.isfile(script) else None, *(f for f, _ in at)]
        self.files = [f for f in dict.fromkeys(files) if f]
        self.call_sites = [(f, line) for f, line in at]
        self.sources, self.losses, self.d_names = {}, {}, set()  # losses: Call -> its Source
        self.inputs, self.d_params = set(), set()  # the losses' inputs (helpers' arguments too), helpers' cst.Params
        # of the values a two-headed D returns, the one its nn.Sigmoid makes (as the run saw it) and the losses take
        self.index = report.settings.get("d_sigmoid_output")
        self.head = self.index is not None

    def run(self):
        if not self._open():
            return
        self._losses()
        if not self.losses and not self.problems:
            self.problems.append("no BCE loss found in " + (", ".join(shown(f) for f in self.sources)
                                                             or "your files (the doctor saw none of D's calls)"))
        d = self._d() if self.losses else None
        in_file = self.sources.get(self.d.get("defined_in"))
        if d is not None:
            self._sigmoid(*d)
        elif in_file is not None and self.d.get("class") in in_file.classes:  # its sigmoid, to list by hand
            known = len(self.problems)
            self._sigmoid(in_file, in_file.classes[self.d["class"]], "class")
            del self.problems[known:]
        if self.d_names:
            for src in self.sources.values():
                self._reads(src)

    def _open(self) -> bool:
        """Each file parsed; False where one cannot be (a problem), or is a notebook cell (nothing is edited in a
        notebook, as in `patching.make_patch`: the finding's snippet stands, without a by-hand list)."""
        if any(cell_label(f) for f in self.files):
            return False
        for file in self.files:
            if not yours(file):
                self.problems.append(f"{shown(file)} is a library's file, not yours: the doctor does not edit it")
                continue
            try:
                self.sources[file] = Source(file, watched=frozenset(RENAMES))
            except (OSError, UnicodeDecodeError, SyntaxError, cst.ParserSyntaxError) as e:
                self.problems.append(f"{shown(file)}: cannot be read as Python source here ({type(e).__name__})")
        return not self.problems

    def _file(self, src: Source) -> FileEdit:
        return self.edit.files.setdefault(src.path, FileEdit())

    def _site(self, src: Source, node, what: str):
        self.edit.sites.append((src.path, src.line(node), what))

    def _problem(self, src: Source, node, why: str):
        self.problems.append(f"{shown(src.path)}:{src.line(node)}: {why}")

    # -- the losses ---------------------------------------------------------------------------------------------
    def _losses(self):
        """Every BCE name in your files, followed to the loss calls it makes (each to switch with D's sigmoid)."""
        for src in self.sources.values():
            for name in src.named:
                self._file(src).rename = True
                leaf = code(name).split(".")[-1]
                parent = src.parent[name]
                if not (isinstance(parent, cst.Call) and parent.func is name):
                    self._site(src, name, f"{leaf}, named without a call: use {RENAMES[leaf]}")
                    self._problem(src, name, f"{leaf} is named without being called, and the doctor cannot follow it")
                elif leaf == "binary_cross_entropy":
                    self._site(src, name, "switch to F.binary_cross_entropy_with_logits")
                    self.losses[parent] = src
                else:
                    self._site(src, name, "switch to nn.BCEWithLogitsLoss")
                    self.losses.update(self._criterion_calls(src, parent))

    def _criterion_calls(self, src: Source, built) -> dict:
        """The calls of the BCELoss built at `built` (each with its Source): inline (`nn.BCELoss()(x, y)`), or
        through the one name (or attribute) it is assigned to, called and never passed on (moved to a device, as
        `adversarial_loss.cuda()` or `criterion = criterion.to(device)`, it is the same module)."""
        node = src.parent[built] if isinstance(src.parent[built], cst.IfExp) else built  # `... if logits else ...`
        while move_of(src, node) is not None:  # `nn.BCELoss().to(device)`
            node = move_of(src, node)
        parent = src.parent[node]
        if isinstance(parent, cst.Call) and parent.func is node:
            return {parent: src}
        target = (parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else
                  parent.target if isinstance(parent, cst.AnnAssign) else None)
        if not isinstance(target, (cst.Name, cst.Attribute)):
            self._problem(src, built, "the BCELoss built there is not assigned to a name the doctor can follow")
            return {}
        name = code(target)
        calls, passed_on = {}, []
        for other in self.sources.values():
            calls.update((c, other) for c in other.calls if callee(c) == name)
            passed_on += [(other, x) for x in other.loads if code(x) == name and handed(other, x, name)]
        for other, x in passed_on:
            self._problem(other, x, f"`{name}` (a BCELoss) is passed on, and the doctor cannot follow its calls")
        if not calls and not passed_on:
            self._problem(src, built, f"no call of `{name}` found in your files")
        for call, other in calls.items():
            self._site(other, call, "a BCE loss: its input must be D's output, logits once D's sigmoid is gone")
        return calls

    # -- D ------------------------------------------------------------------------------------------------------
    def _d(self):
        """D's names in the loss calls, checked against the diagnosis; (Source, its function or class, kind)."""
        found = set()
        for call, at in self.losses.items():
            for src, made, where in self._origins(at, _input(call), call):
                if not self._head_taken(src, made, where):
                    continue
                made = made.call if isinstance(made, Part) else made
                name = callee(made) if isinstance(made, cst.Call) else ""
                if not name or name.split(".")[-1] in SIGMOIDS | SHAPE_OPS | set(RENAMES):
                    self._problem(src, where, "the loss's input is not followed to D's output" if not name else
                                  f"the loss's input comes from {name}(...), not straight from D")
                    if name.split(".")[-1] in SIGMOIDS:
                        self._site(src, made, "D's sigmoid, applied here: take it off (D's output is then logits)")
                    continue
                self.d_names.add(name)
                found.add((src, name))
        cls = self.d.get("class")
        in_file = self.sources.get(self.d.get("defined_in"))
        functions = {(src, name) for src, name in found if name in src.functions}
        if functions and len(self.d_names) == 1:
            (src, name), = functions
            return src, src.functions[name], "function"
        if found and in_file is not None and cls in in_file.classes and self._called_where_seen(found):
            built = [(src, c) for src in self.sources.values() for c in src.calls if callee(c).split(".")[-1] == cls]
            for src, c in built[1:] if len(built) > 1 else []:
                self._problem(src, c, f"class {cls} is built here too: its sigmoid goes from every {cls}, and the "
                              "doctor follows only D's output")
            return in_file, in_file.classes[cls], "class"
        if found:
            self.problems.append(f"the losses' inputs come from {', '.join(sorted(self.d_names))}, which the doctor "
                                 "cannot match to D's code")
        return None

    def _head_taken(self, src: Source, made, where) -> bool:
        """A loss's input taken from D as its sigmoid makes it: D's output, or of a two-headed D (one that returns a
        tuple), the value its nn.Sigmoid makes, unpacked (`validity, label = D(x)`); every loss from that one place
        (where the run saw no nn.Sigmoid make it, `torch.sigmoid` in forward, the place the losses take)."""
        index = made.index if isinstance(made, Part) else None
        if index is None and not (self.head and isinstance(made, cst.Call)):
            return True
        if index is not None and self.index in (None, index):
            self.index = index
            return True
        self._problem(src, where, f"the loss takes {'a value' if index is None else f'value {index}'} of "
                      f"{callee(made.call if index is not None else made)}(...), and D's sigmoid makes its output "
                      f"{self.index}: the doctor follows a D that returns several values only unpacked (`validity, "
                      "label = D(x)`), each loss from one place")
        return False

    def _origins(self, src: Source, value, where, depth=0) -> list:
        """Where a loss's input `value` comes from: `[(Source, what makes it, the call to name if it is not D)]`. An
        input that arrives as a parameter of the function the loss is in (a loss helper, `def loss_fn(pred, target)`)
        is followed to the value each call of that function passes there, once per parameter."""
        self.inputs.add(value)
        made = src.origin(value) if value is not None else None
        if not isinstance(made, cst.Param):
            return [(src, made, where)]
        if made in self.d_params:
            return []  # followed already, by another loss in the same helper
        self.d_params.add(made)
        helper = src.parent[src.parent[made]]
        calls, unfollowed = passed(self.sources, src, made)
        for other, node, why in unfollowed:
            self._problem(other, node, why)
        if not calls and not unfollowed:
            self._problem(src, made, f"the loss's input `{made.name.value}` is a parameter of "
                          f"`{helper.name.value}`, which is called nowhere in your files")
        found = []
        for other, call, value in calls:
            self._site(other, call, f"a BCE loss through `{helper.name.value}`: its `{made.name.value}` must be D's "
                       "output, logits once D's sigmoid is gone")
            if value is None or depth >= 8:
                self._problem(other, call, f"the doctor cannot tell what this call passes as `{made.name.value}`")
            else:
                found += self._origins(other, value, call, depth + 1)
        return found

    def _called_where_seen(self, found) -> bool:
        """Each name the losses' inputs come from is called where the diagnosis saw D called, and every place it saw
        D called calls one of them."""
        seen = set(self.call_sites)
        lines = {(src.path, line) for src in self.sources.values() for c in src.calls if callee(c) in self.d_names
                 for line in src.lines(c)}
        for src, name in found:
            if not any((src.path, line) in seen for c in src.calls if callee(c) == name for line in src.lines(c)):
                self.problems.append(f"`{name}`, whose output the losses take, is not where the diagnosis saw D called")
        for file, line in seen - lines:
            self.problems.append(f"{shown(file)}:{line}: D is called there under a name the doctor does not follow")
        return not self.problems

    # -- where D applies its sigmoid --------------------------------------------------------------------------------
    def _sigmoid(self, src: Source, owner, kind: str):
        """D's sigmoid: its class's nn.Sigmoid whose output forward returns (removed from the container forward
        returns the output of, or taken off where forward calls it), else a sigmoid call on what its forward (a plain
        function D: the function) returns; for a two-headed D, on the value it returns at the place the losses take."""
        function = owner if kind == "function" else next(
            (s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        attribute, made = None, "its output" if self.index is None else f"its output {self.index}"
        if kind == "class" and self.ctx.d_sigmoid:
            node = _sigmoid_module(src, owner, self.ctx.d_sigmoid if self.head else None)
            if node is not None and _removable(src, node):
                self._site(src, node, f"D's nn.Sigmoid() that makes {made}: remove it ({made} is then logits)")
                container = f"self.{self.ctx.d_sigmoid.split('.')[0]}"
                if returned(src, function, lambda call: callee(call) == container, self.index) is None:
                    self._problem(src, function or owner, f"forward does not return {container}(...) as it is "
                                  f"({made}), so the doctor cannot tell what removing its nn.Sigmoid leaves")
                edit = self._file(src)
                edit.sigmoid_class, edit.sigmoid_at = owner.name.value, (src.line(node), src.pos[node].start.column)
                return
            attribute = self._attribute(src, owner, node)
            if attribute is None:
                return
        applied = returned(src, function, lambda call: _is_sigmoid_call(call, attribute), self.index)
        if applied is None:
            where = f"function {owner.name.value}" if kind == "function" else f"class {owner.name.value}'s forward"
            self._problem(src, function or owner, f"no sigmoid found on the value {where} returns"
                          + ("" if self.index is None else f" at place {self.index}"))
            return
        parent = src.parent[applied]
        inner = applied.args[0].value if applied.args else applied.func.value
        parens = not atomic(inner) and not isinstance(parent, (cst.Assign, cst.AnnAssign, cst.Return, cst.Arg))
        self._file(src).nodes[src.key(applied)] = (UNWRAP, parens)
        self._site(src, applied, f"D's sigmoid on {made}: take it off ({made} is then logits)")

    def _attribute(self, src: Source, owner, node) -> str | None:
        """`self.out`, where D keeps its nn.Sigmoid as an attribute and calls it in forward; else None (a problem)."""
        held = src.parent.get(node) if node is not None else None
        attribute = (code(held.targets[0].target) if isinstance(held, cst.Assign) and len(held.targets) == 1
                     else None)
        if attribute != f"self.{self.ctx.d_sigmoid}":
            self._problem(src, node or owner, "D builds the nn.Sigmoid whose output it returns "
                          f"(D.{self.ctx.d_sigmoid}) in a way the doctor cannot edit")
            return None
        self._site(src, node, "D's nn.Sigmoid, called in forward (the call is taken off)")
        return attribute

    # -- what your code reads from D ---------------------------------------------------------------------------
    def _reads(self, src: Source):
        """Each use of D's output that is not a loss's input or a variable holding it, put through a sigmoid; a use
        the doctor cannot be sure of (an in-place change, a variable read before it is bound) is a problem."""
        held = {text for (_, text), binds in src.binds.items() if any(self._holds_d(src, b) for b in binds)}
        roots = [c for c in src.calls if callee(c) in self.d_names]
        for x in src.loads:
            if not isinstance(x, (cst.Name, cst.Attribute)) or code(x) not in held:
                continue
            bind = src.resolve(x)
            if bind is None:
                self._problem(src, x, f"`{code(x)}` may hold D's output here, and the doctor cannot tell")
            elif self._holds_d(src, bind):
                roots.append(x)
        for x in src.augmented:
            bind = src.resolve(x)
            if bind is not None and self._holds_d(src, bind):
                self._problem(src, x, f"`{code(x)}` (D's output) is changed in place")
        for root in roots:
            self._read(src, root)

    def _read(self, src: Source, root):
        """One use of D's output (a call of D, or a load of a variable holding it), put through a sigmoid unless it
        is kept as it is; a two-headed D's call must be unpacked (its values are then followed one by one)."""
        if self.index is not None and isinstance(root, cst.Call) and callee(root) in self.d_names:
            if not unpacked(src, root):
                self._problem(src, root, "D returns several values, used here other than unpacked (`validity, "
                              "label = D(x)`): the doctor cannot tell which it reads")
            return
        top = src.chain_top(root)
        parent = src.parent[top]
        if self._kept(src, top, parent):
            return
        if isinstance(parent, cst.Attribute) and parent.attr.value.endswith("_"):
            self._problem(src, top, f"D's output is changed in place (.{parent.attr.value})")
            return
        self._file(src).nodes[src.key(top)] = (THROUGH_SIGMOID,)
        self._site(src, top, "a value read from D's output: put it through .sigmoid()")

    def _kept(self, src: Source, top, parent) -> bool:
        """D's output as a BCE loss's input, held in a variable (its reads are followed), or thrown away."""
        if isinstance(parent, cst.Arg) and top in self.inputs:
            return True
        if isinstance(parent, cst.Assign) and parent.value is top:
            return all(isinstance(t.target, (cst.Name, cst.Attribute)) for t in parent.targets)
        if isinstance(parent, cst.AnnAssign) and parent.value is top:
            return isinstance(parent.target, (cst.Name, cst.Attribute))
        return isinstance(parent, cst.Expr)

    def _holds_d(self, src: Source, bind) -> bool:
        """A binding of D's output (of a two-headed D, the value its sigmoid makes): a helper's parameter that every
        call passes it to, or a value made from it."""
        if bind.param is not None:
            return bind.param in self.d_params
        made = src.held(bind)
        if isinstance(made, Part):
            return made.index == self.index and callee(made.call) in self.d_names
        return made in self.d_params or isinstance(made, cst.Call) and callee(made) in self.d_names


def _removable(src: Source, sigmoid) -> bool:
    """An nn.Sigmoid() that `patching` removes: an nn.Sequential's (or nn.ModuleList's) argument, a list's or
    tuple's element, or appended as a statement of its own."""
    parent = src.parent[sigmoid]
    if isinstance(parent, cst.Element):
        return True
    if not isinstance(parent, cst.Arg) or parent.keyword is not None:
        return False
    call = src.parent[parent]
    if callee(call).endswith(".append"):
        return isinstance(src.parent[call], cst.Expr)
    return callee(call).split(".")[-1] in ("Sequential", "ModuleList")


def _sigmoid_module(src: Source, owner, path: str | None):
    """The nn.Sigmoid() call that builds the module the run saw make D's output: the last one D's class builds,
    in source order (an earlier one is a gate inside the network); with `path` (a two-headed D's head), the one its
    class builds at that dotted path (`self.adv_layer = nn.Sequential(nn.Linear(...), nn.Sigmoid())`: adv_layer.1)."""
    if path is None:
        last = LastSigmoid(owner.name.value)
        MetadataWrapper(src.module, unsafe_skip_copy=True).visit(last)
        return last.node
    return next((c for c in src.calls if is_sigmoid_module(c) and src.line(c) in src.lines(owner)
                 and built_path(src, c) == path), None)


def _input(call: cst.Call):
    """A loss call's input: its first positional argument, or `input=`."""
    for arg in call.args:
        if arg.keyword is None and not arg.star:
            return arg.value
        if arg.keyword is not None and arg.keyword.value == "input":
            return arg.value
    return None


def _is_sigmoid_call(node, attribute: str | None = None) -> bool:
    """`torch.sigmoid(x)`, `F.sigmoid(x)`, `x.sigmoid()`, or a call of D's nn.Sigmoid attribute (`self.out(x)`)."""
    name = callee(node)
    one = len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star
    if attribute is not None and name == attribute:
        return one
    if name.split(".")[-1] not in SIGMOIDS:
        return False
    return one or (not node.args and isinstance(node.func, cst.Attribute))


# -- as a fix's edit (`fixes.Logits`) -------------------------------------------------------------------------------
def plan(name: str, plans: dict, report, ctx, by_hand: list) -> None:
    """The logits edit into `plans` (file -> `patching._Plan`), whole; else nothing, and the lines by hand."""
    edit = logits_edit(report, ctx)
    if edit.why_not:
        by_hand.append((name, edit.by_hand()))
        return
    for file, change in edit.files.items():
        p = plans[file].of(FileEdit)
        p.rename = p.rename or change.rename
        p.sigmoid_class = change.sigmoid_class or p.sigmoid_class
        p.sigmoid_at = change.sigmoid_at or p.sigmoid_at
        p.nodes.update(change.nodes)


def missed(name: str, plan, shown_as: str) -> list:
    """The parts of a planned logits edit that found nothing to edit (`patching.make_patch` then leaves it all out)."""
    edit, done = plan.of(FileEdit), plan.done
    undone = (["a BCE loss's name"] if edit.rename and f"{LOGITS}:loss" not in done else []) + (
        [f"class {edit.sigmoid_class}'s final nn.Sigmoid"] if edit.sigmoid_class and f"{LOGITS}:sigmoid" not in
        done else []) + [f"line {k[1]}" for k in edit.nodes if f"{LOGITS}:{k}" not in done]
    if not undone:
        return []
    return [(name, f"{shown_as}: the doctor could not edit {', '.join(undone)}: remove D's sigmoid and switch its BCE "
                   "losses to their logits form by hand, reading D's probabilities through .sigmoid()")]
