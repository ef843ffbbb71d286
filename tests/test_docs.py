"""The README and docs/ stay true: measured tables match their stored evidence, "Where it lives" pointers name
objects that exist, and links lead somewhere.

A measured table is a Markdown table with a `<!-- source: PATH[, PATH...] -->` comment on one of the lines just
above it; PATH is a stored notebook (its outputs are the evidence) or a docs/*.json file. Every table whose cells
hold bare numbers must carry one, so a new measured table cannot slip in without its evidence.
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

SOURCE = re.compile(r"<!--\s*source:\s*(.*?)\s*-->")
# A number not glued to a word or a decimal point: "260-453" is two numbers, "x2" and "fp32" are none.
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(%?)")
# A cell that is only a measurement: 563, 1.85x, 20%, 260-453, 1.66x (1.60-1.84).
MEASURED_CELL = re.compile(r"^[\d.,%x()\s-]*\d[\d.,%x()\s-]*$")


def _numbers(text: str) -> list[tuple[float, int, bool]]:
    """(value, decimals, is a percentage) for every number in the text; 102,400 is one number."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    return [(float(m.group(1)), len(m.group(1).partition(".")[2]), bool(m.group(2))) for m in NUMBER.finditer(text)]


def _notebook_outputs(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    parts = []
    for cell in cells:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            data = out.get("data", {})
            for kind in ("text/markdown", "text/plain"):
                parts.append("".join(data.get(kind, "")))
    return "\n".join(parts)


def _json_values(node, out: list[float]) -> None:
    if isinstance(node, bool):
        return
    if isinstance(node, (int, float)):
        out.append(float(node))
    elif isinstance(node, str):
        out.extend(v for v, _, _ in _numbers(node))
    elif isinstance(node, dict):
        for key, value in node.items():
            _json_values(key, out)
            _json_values(value, out)
    elif isinstance(node, list):
        for value in node:
            _json_values(value, out)


def source_values(relpath: str) -> list[float]:
    """Every number in a stored notebook's outputs, or every value of a docs/*.json file (a GPU run's
    docs/gpu/RUN/evidence.json included)."""
    path = ROOT / relpath
    assert path.is_file(), f"source {relpath} does not exist"
    if path.suffix == ".ipynb":
        return [v for v, _, _ in _numbers(_notebook_outputs(path))]
    gpu_run = path.name == "evidence.json" and path.parent.parent == ROOT / "docs" / "gpu"
    assert path.suffix == ".json" and (path.parent == ROOT / "docs" or gpu_run), \
        f"a source is a notebook, docs/*.json or docs/gpu/RUN/evidence.json: {relpath}"
    values: list[float] = []
    _json_values(json.loads(path.read_text(encoding="utf-8")), values)
    return values


def _matches(value: float, decimals: int, percent: bool, evidence: list[float]) -> bool:
    """The stated number is some evidence rounded as written (a percentage may be a stored share)."""
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(v - value) <= tolerance or (percent and abs(100 * v - value) <= tolerance) for v in evidence)


def tables(text: str):
    """(first line number, the table's lines, its sources) for every Markdown table in the text."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            i += 1
        # the marker: on one of the four lines above the table (a caption may sit between), or the line below it
        near = lines[max(0, start - 4):start] + lines[i:i + 2]
        sources = [s.strip() for line in near for m in SOURCE.finditer(line) for s in m.group(1).split(",")]
        yield start + 1, lines[start:i], sources


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def unmatched_numbers(table: list[str], sources: list[str]) -> list[str]:
    """The numbers in the table's body that none of its sources holds."""
    evidence = [v for s in sources for v in source_values(s)]
    missing = []
    for row in table[2:]:  # the header and the |---| line hold no measurements
        for cell in _cells(row):
            for value, decimals, percent in _numbers(cell):
                if not _matches(value, decimals, percent, evidence):
                    missing.append(f"{value:.{decimals}f}{'%' if percent else ''} in `{cell}`")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_measured_tables_match_their_sources(page):
    problems = []
    for line, table, sources in tables(page.read_text(encoding="utf-8")):
        measured = any(MEASURED_CELL.match(cell) for row in table[2:] for cell in _cells(row))
        if not sources:
            if measured:
                problems.append(f"line {line}: a table of measurements without a <!-- source: ... --> marker")
            continue
        missing = unmatched_numbers(table, sources)
        if missing:
            problems.append(f"line {line} (source {', '.join(sources)}): not in the source: {'; '.join(missing)}")
    assert not problems, f"{page.name}:\n" + "\n".join(problems)


def test_a_changed_number_is_caught():
    """The check can fail: the README's headline table, its first images/s changed by hand, no longer matches."""
    found = [(t, s) for _, t, s in tables(README.read_text(encoding="utf-8")) if s]
    assert found, "the README has a measured table"
    table, sources = found[0]
    assert unmatched_numbers(table, sources) == []
    cells = _cells(table[2])
    stated = int(cells[1])
    evidence = [v for s in sources for v in source_values(s)]
    wrong = next(n for n in range(stated + 1, stated + 1000) if not _matches(n, 0, False, evidence))
    changed = table[:2] + ["| " + " | ".join([cells[0], str(wrong), *cells[2:]]) + " |"] + table[3:]
    assert unmatched_numbers(changed, sources) == [f"{wrong} in `{wrong}`"]


def test_a_table_of_numbers_needs_a_source():
    page = "| run | images/s |\n|---|---:|\n| mine | 1234 |\n"
    (line, table, sources), = tables(page)
    assert not sources and any(MEASURED_CELL.match(c) for c in _cells(table[2]))


# --- "Where it lives" pointers -------------------------------------------------------------------------------

POINTER = re.compile(r"Where it lives:(.*?)(?:\n\s*\n|$)", re.S)
TICKED = re.compile(r"`([^`]+)`")
MODULE_PATH = re.compile(r"^gantools(?:/\w+)*(?:\.py|/)?$")


def pointer_paragraphs():
    """(where, paragraph) for every "Where it lives" paragraph in the notebooks' markdown and in README/docs."""
    for nb in NOTEBOOKS:
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "markdown":
                for m in POINTER.finditer("".join(cell["source"])):
                    yield f"{nb.name} cell {i}", m.group(1)
    for page in PAGES:
        for m in POINTER.finditer(page.read_text(encoding="utf-8")):
            yield str(page.relative_to(ROOT)), m.group(1)


def _module(path: str):
    """gantools/x.py (a file) or gantools/x/ (a package), which must exist in that form, imported."""
    target = ROOT / path
    if path.endswith(".py"):
        assert target.is_file(), f"{path} is not a file"
    elif path.endswith("/"):
        assert (target / "__init__.py").is_file(), f"{path} is not a package"
    else:
        assert target.with_suffix(".py").is_file() or (target / "__init__.py").is_file(), f"{path} does not exist"
    return importlib.import_module(path.removesuffix(".py").rstrip("/").replace("/", "."))


def _defined_in(obj, module) -> bool:
    """A function or class must be defined in the module named (or inside the package), not merely imported."""
    home = getattr(obj, "__module__", None)
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or home is None:
        return True
    return home == module.__name__ or home.startswith(module.__name__ + ".")


def _member_of_class(cls, name: str) -> bool:
    """An attribute, a dataclass field, an instance attribute set as self.name, or a constructor parameter."""
    if hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}):
        return True
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\b[^\n=]*=(?!=)", source):
            return True
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _resolve(module, dotted: str, classes: list) -> None:
    """getattr along the dotted name; the classes passed on the way are added to `classes`."""
    obj = module
    for part in dotted.split("."):
        if inspect.isclass(obj) and not hasattr(obj, part):
            assert _member_of_class(obj, part), f"{obj.__name__} has no {part}"
            return
        obj = getattr(obj, part)
        if obj is getattr(module, dotted.split(".")[0]):
            assert _defined_in(obj, module), f"{part} is defined in {obj.__module__}, not in {module.__name__}"
        if inspect.isclass(obj):
            classes.append(obj)


def pointer_problems(paragraph: str) -> list[str]:
    """Each `gantools/x.py` sets the module that the names after it live in (names before the first module path
    live in that first one); a bare name its module does not define may be a member of a class the paragraph
    names (a field, an instance attribute, a constructor parameter such as `generator=`)."""
    tokens = TICKED.findall(paragraph)
    if not any(MODULE_PATH.match(t) for t in tokens):
        return [f"no module path in: {paragraph.strip()[:80]}"]
    named, problems = _named(tokens)
    classes, deferred = [], []
    for name, module in named:
        if module is False:
            continue  # its module path is already reported
        try:
            _resolve(module, name, classes)
        except (AssertionError, AttributeError) as e:
            deferred.append((name, module, e))
    for name, module, error in deferred:
        if "." in name or not any(_member_of_class(cls, name) for cls in classes):
            problems.append(f"`{name}` in {module.__name__}: {error}")
    return problems


def _named(tokens: list) -> tuple[list, list]:
    """`pointer_problems`' first pass: each name with the module it lives in (None while no module path came yet,
    False where that module path did not import), and the problems of the module paths themselves."""
    problems, named, current = [], [], None
    for token in tokens:
        if MODULE_PATH.match(token):
            try:
                current = _module(token)
            except (AssertionError, ImportError) as e:
                problems.append(f"`{token}`: {e}")
                current = False
            if not named or named[-1][1] is not None:
                continue
            named = [(name, current) if module is None else (name, module) for name, module in named]
            continue
        named.append((token.removeprefix("self.").split("(")[0].rstrip("=").strip(), current))
    return named, problems


def test_where_it_lives_pointers_resolve():
    found = list(pointer_paragraphs())
    assert len(found) >= 30, "the notebooks' pointers were found"
    problems = [f"{where}: {p}" for where, paragraph in found for p in pointer_problems(paragraph)]
    assert not problems, "\n".join(problems)


def test_a_wrong_pointer_is_caught():
    assert pointer_problems("`gantools/core/losses.py`, `d_loss` and `R1`") == []
    assert pointer_problems("`gantools/core/trainer.py`, `d_loss`")  # imported there, defined in losses.py
    assert pointer_problems("`gantools/core/losses.py`, `no_such_loss`")
    assert pointer_problems("`gantools/no_such_module.py`, `run`")


# --- size and links ------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size < 15_000, f"README.md is {size} bytes: move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to files that do not exist: {broken}"


def _layout_block() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("```", text.index("## Layout"))
    return text[start:text.index("```", start + 3)]


def test_the_readme_layout_names_every_subpackage_and_module_and_no_other():
    block, package = _layout_block(), ROOT / "gantools"
    modules = [p for p in package.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    missing = [str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{p.stem}\b", block)]
    missing += [f"{d.name}/" for d in package.iterdir() if (d / "__init__.py").exists() and f"{d.name}/" not in block]
    assert missing == [], "the README's layout leaves these out"
    stems = {p.stem for p in modules}
    assert sorted(set(re.findall(r"\b(\w+)\.py\b", block)) - stems - {"evidence", "report", "wheels", "conf"}) == []
