"""The package's comments and docstrings stay true as the code moves on: they say why, not when, not which of our
issues led here, and not what one machine measured once. A date, an issue history or a measured number goes stale the
day the code or the machine changes; the evidence for a constant lives in docs/ (e.g. "evidence: docs/tune.md").
Patterns are tested on example strings below, so what they let through is a decision, not an accident."""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import gantools

PACKAGE = Path(gantools.__file__).resolve().parent
ROOT = PACKAGE.parent

MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
         r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
YEAR = r"(?:19|20)\d\d"
UNIT = r"(?:ms|s|sec|seconds?|min|minutes?|h|hours?|%|x|[KMGT]i?B|images/s|it/s|steps/s|TFLOP/s)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
DURATION = r"(?:ms|s|sec|seconds?|min|minutes?|hours?)"
MEASURING = r"\b(?:measured|measuring|took|timed|clocked|benchmarked|observed|ran in|profiled at)\b"
# Another project's issue or pull request (pytorch/pytorch#80167, JuliaGPU/CUDA.jl#264, a github.com link): a reason
# for a workaround that is allowed, and after it, in the same comment or docstring, its bare "#123" follow-ups.
UPSTREAM = re.compile(r"\b[\w.-]+/[\w.-]+#\d+|github\.com/(?!\w+/gantools\b)[\w.-]+/[\w.-]+/(?:issues|pull)/\d+")

PATTERNS = {
    "a date": re.compile(rf"\b{YEAR}-[01]\d-[0-3]\d\b|\b{MONTH}\.? (?:[0-3]?\d(?:st|nd|rd|th)?,? )?{YEAR}\b|"
                         rf"\b[0-3]?\d(?:st|nd|rd|th)? {MONTH}\.?,? {YEAR}\b|\bas of (?:{MONTH} )?{YEAR}\b"),
    "our issue history": re.compile(r"\b(?:issue|ticket|PR|pull request)s? #?\d+|(?<![\w/])#\d+\b|"
                                    r"\bgantools#\d+", re.IGNORECASE),
    "a measured number": re.compile(
        # a measuring word and a number with a unit in one clause, either order
        rf"{MEASURING}[^.;]{{0,60}}?(?<![\w.]){NUMBER} ?{UNIT}(?!\w)|"
        rf"(?<![\w.]){NUMBER} ?{UNIT}(?!\w)[^.;:]{{0,40}}?{MEASURING}|"
        rf"{MEASURING}:? (?:about |~)?{NUMBER}\b|"  # "measured: 1330 at 100 steps"
        rf"(?<![\w.]){NUMBER} ?{DURATION} (?:for|on) (?:the|a|an|one|this) |"  # "36 ms for the 32 px DCGAN"
        r"\((?:as )?measured\b(?!,)|"  # "(measured)", "(measured on glyphs: ...)": one run's finding as a fact
        r"\bmeasured on the\b[^.;:]{0,30}\b(?:CPU|GPU|machine|H100|H200|A100|T4)s?\b|"  # one machine's number
        r"(?<![\w.])\d+\.\d\dx\b|"  # a speed-up to the hundredth is a measurement: "1.62x", "2.78x the FID"
        r"\b\d+(?:\.\d+)?x (?:faster|slower|as fast)\b", re.IGNORECASE),
}
QUOTED = re.compile(r"\"[^\"\n]*\"|(?<!\w)'[^'\n]*'(?!\w)|`[^`\n]*`")  # an example of output, or code: not a claim


def offences(text: str) -> list:
    """(what, matched) for each date, issue history or measured number in one comment or docstring.

    Args:
        text: the comment (its lines joined) or the docstring.
    Returns:
        A list of (pattern name, matched text); empty where the text is timeless.
    """
    claims = QUOTED.sub('""', " ".join(text.split()))
    upstream = UPSTREAM.search(claims)
    found = []
    for what, pattern in PATTERNS.items():
        for m in pattern.finditer(claims):
            if m.group(0).startswith("#") and upstream and upstream.start() < m.start():
                continue  # "#92348" after "pytorch/pytorch#91469": the same project's thread
            found.append((what, m.group(0)))
    return found


def _texts(path: Path):
    """(line, text) for each comment block (consecutive comment lines joined) and each docstring of a module."""
    source = path.read_text()
    block, start, last = [], 0, -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if line != last + 1 and block:
            yield start, "\n".join(block)
            block = []
        if not block:
            start = line
        block.append(tok.string.lstrip("#:").strip())
        last = line
    if block:
        yield start, "\n".join(block)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _found() -> list:
    """file:line: what: matched, for every offence in the package (the line the match starts on)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for start, text in _texts(path):
            lines = text.splitlines()
            for what, matched in offences(text):
                first = matched.split()[0].strip('("')
                at = start + next((i for i, line in enumerate(lines) if first in line), 0)
                found.append(f"{path.relative_to(ROOT)}:{at}: {what}: {matched!r}")
    return found


@pytest.mark.parametrize("text, what", [
    ("Chosen on 2025-11-03 after the benchmark.", "a date"),
    ("As of Nov 2026 the fused optimizer is default.", "a date"),
    ("Slower since 3 November 2026.", "a date"),
    ("Added for issue 12: workers hung.", "our issue history"),
    ("The fix for the deadlock (#12).", "our issue history"),
    ("See gantools#41.", "our issue history"),
    ("a torch bug (pytorch/pytorch#80167); our workaround from issue 7", "our issue history"),
    ("measured: 10 s for 2 workers", "a measured number"),
    ("24 s measured for the 32 px DCGAN on the 2-core CPU", "a measured number"),
    ("16-bit halves it at best (measured 1.95x for the whole step)", "a measured number"),
    ("a budget that short compares noise (measured: 1330 at 100 steps)", "a measured number"),
    ("on glyphs, batch x2 had 2.78x the reference's FID", "a measured number"),
    ("the compiled step is 3x faster here", "a measured number"),
    ("one step took 3.1 ms on the CPU", "a measured number"),
    ("one checkpoint at its end; 36 ms for the 32 px DCGAN here", "a measured number"),
    ("a code as long as z made G ignore z (measured on glyphs: every sample the same)", "a measured number"),
    ("Seconds to score one config, measured on the 2-core CPU; less on a GPU", "a measured number"),
])
def test_the_patterns_catch_dates_issue_histories_and_measured_numbers(text, what):
    assert what in [w for w, _ in offences(text)], offences(text)


@pytest.mark.parametrize("text", [
    "DCGAN (Radford et al., 2015) at 28, 32 and 64 px.",
    "Lazy as in StyleGAN2 (Karras et al. 2020): every `interval` D steps.",
    "a host sync per optimizer step (pytorch/pytorch#80167); fused steps avoid it",
    "pytorch/pytorch#91469 and #92348; without #181606, compiled gradients lose their graph",
    "JuliaGPU/CUDA.jl#264: handle creation close to OOM fails",
    "a speed ratio within 5% of 1 reads as no faster: timed chunks on a busy machine spread this much",
    "kept if faster on the median and it won at least 80% of the repeats",
    "the limit becomes the wider of 1.1x and that second seed's distance",
    "Fetch the Inception weights (about 100 MB, needs internet).",
    "kills those still running 30 s later",
    'here bf16 ran "1.62x as fast as fp32": keep it',
    "'1.62x as fast as fp32', 'no faster than fp32 (1.02x, ...)'",
    "shapes (B, 3, 64, 64); 2048 x 128 floats here, by design",
    "a constant chosen by measurement (evidence: docs/tune.md)",
    "the measured warm-up seconds of each config",
    "returns (measured, None), or (None, why it was rejected)",
    "Speed, measured on this machine: the benchmark ladder",
    "a share measured as a difference of two speeds can fall below zero: noise",
    "stopped 5 s after the signal, as torch's own join timeout does",
])
def test_the_patterns_let_through_what_is_timeless(text):
    assert offences(text) == []


def test_every_comment_block_and_docstring_is_read_and_no_string_is(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Module."""\nx = 1  # one\n# two\n\n# three\n\n\ndef f():\n    """Function."""\n'
                      '    return "# not a comment"\n')
    assert sorted(_texts(module)) == [(1, "Module."), (2, "one\ntwo"), (5, "three"), (9, "Function.")]


def test_comments_and_docstrings_hold_no_dates_issue_histories_or_measured_numbers():
    found = _found()
    assert not found, "\n".join(["say why, not when, which issue or what one run measured (evidence in docs/):",
                                 *found])
