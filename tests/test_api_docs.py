"""Every public function and class of `import gantools as gt` explains itself in `help()`: an `Args:` section that
names each parameter (a class: its constructor's) and, for a function that returns something, a `Returns:` section.
The checker is tested on small functions below, so what it lets through is a decision, not an accident."""
import inspect
import re

import pytest

import gantools

# Public names the rule does not apply to, with the reason.
EXEMPT = {
    "TrainConfig": "its fields are described once, by their Knobs (help, type, choices); its docstring points to "
                   "`config.knobs()` and `train --help` rather than repeating them as Args",
}
HEADER = re.compile(r"^(\s*)(Args|Returns|Raises):\s*$")
ENTRY = re.compile(r"^\s*(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?:")


def sections(doc: str) -> dict:
    """A Google-style docstring's sections, each the lines indented under its header.

    Args:
        doc: the docstring.
    Returns:
        Section name ('Args', 'Returns', 'Raises') -> its body lines.
    """
    found, current, indent = {}, None, 0
    for line in inspect.cleandoc(doc or "").splitlines():
        header = HEADER.match(line)
        if header:
            current, indent = header.group(2), len(header.group(1))
            found[current] = []
        elif current and line.strip() and len(line) - len(line.lstrip()) > indent:
            found[current].append(line)
        elif line.strip():
            current = None
    return found


def documented(args: list) -> set:
    """The parameter names an Args body gives entries for ("a, b: ..." documents both; stars dropped).

    Args:
        args: the Args section's lines.
    Returns:
        The names.
    """
    if not args:
        return set()
    top = min(len(line) - len(line.lstrip()) for line in args)
    names = set()
    for line in args:
        entry = ENTRY.match(line) if len(line) - len(line.lstrip()) == top else None
        if entry:
            names.update(name.strip().lstrip("*") for name in entry.group(1).split(","))
    return names


def problems(obj) -> list:
    """What `obj`'s docstring leaves out: a parameter without an Args entry, an entry for no parameter, a missing
    Returns section where the function returns something (a class: its constructor's parameters, in the class
    docstring).

    Args:
        obj: a function or a class.
    Returns:
        One line per problem; empty where the docstring is complete.
    """
    is_class = inspect.isclass(obj)
    doc = inspect.getdoc(obj) or ""
    if not doc:
        return ["no docstring"]
    found = sections(doc)
    signature = inspect.signature(obj.__init__ if is_class else obj)
    listed = documented(found.get("Args", []))
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = [name for name, p in signature.parameters.items()
              if name != "self" and (p.kind not in variadic or name in listed)]
    out = [f"Args has no entry for {name!r}" for name in params if name not in listed]
    out += [f"Args names {name!r}, which is not a parameter" for name in sorted(listed - set(signature.parameters))]
    returns = signature.return_annotation
    if not is_class and returns not in (None, "None") and "Returns" not in found:
        out.append("no Returns section")
    return out


def public_callables() -> list:
    """The functions and classes of `gantools.__all__`, errors left out: an error's docstring says when it is raised,
    and its constructor takes only the message."""
    return [name for name in gantools.__all__
            if (inspect.isfunction(obj := getattr(gantools, name)) or inspect.isclass(obj))
            and not (inspect.isclass(obj) and issubclass(obj, Exception))]


@pytest.mark.parametrize("name", [name for name in public_callables() if name not in EXEMPT])
def test_every_public_function_and_class_documents_its_parameters_and_what_it_returns(name):
    assert problems(getattr(gantools, name)) == []


def test_the_exempt_names_are_public_and_still_have_a_docstring():
    for name in EXEMPT:
        assert name in gantools.__all__ and inspect.getdoc(getattr(gantools, name))


def test_trainconfig_points_to_where_its_fields_are_described():
    doc = inspect.getdoc(gantools.TrainConfig)
    assert "knobs()" in doc and "--help" in doc


def _complete(images: int, seed: int = 0, *extra, **overrides) -> list:
    """Draw something.

    Args:
        images, seed: how many, and from which seed.
        **overrides: documented, so checked like any parameter.
    Returns:
        The drawings.
    """


def _missing_a_parameter(images: int, seed: int = 0) -> list:
    """Draw something.

    Args:
        images: how many.
    Returns:
        The drawings.
    """


def _missing_returns(images: int) -> list:
    """Draw something.

    Args:
        images: how many.
    """


def _naming_a_stale_parameter(images: int) -> None:
    """Draw something.

    Args:
        images: how many.
        size: a parameter that is gone.
    """


def _returning_nothing(images: int) -> None:
    """Draw something.

    Args:
        images (int): how many; a Raises section below is not an Args entry.
    Raises:
        seed: not a parameter, but not in Args either.
    """


class _Drawer:
    """Draws.

    Args:
        images: how many.
    """

    def __init__(self, images: int, seed: int = 0):
        pass


def test_the_checker_catches_a_missing_parameter_a_missing_returns_and_a_stale_entry():
    assert problems(_complete) == []
    assert problems(_returning_nothing) == []
    assert problems(_missing_a_parameter) == ["Args has no entry for 'seed'"]
    assert problems(_missing_returns) == ["no Returns section"]
    assert problems(_naming_a_stale_parameter) == ["Args names 'size', which is not a parameter"]
    assert problems(_Drawer) == ["Args has no entry for 'seed'"]
    assert problems(lambda x: x) == ["no docstring"]
