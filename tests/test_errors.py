"""One family of errors: everything a user can fix is a GantoolsError, and keeps the base it always had."""
import pytest

import gantools
from gantools import errors


@pytest.mark.parametrize("name, old_home, builtin", [
    ("ConfigError", "core.config", ValueError), ("DataError", "core.data", RuntimeError),
    ("CheckpointError", "core.checkpoint", RuntimeError), ("OutOfMemory", "core.recovery", RuntimeError),
    ("NonFiniteLossError", "core.recovery", FloatingPointError), ("QualityError", "core.metrics", RuntimeError),
])
def test_every_user_error_shares_the_base_and_keeps_its_old_name_and_base(name, old_home, builtin):
    import importlib

    cls = getattr(errors, name)
    assert issubclass(cls, gantools.GantoolsError) and issubclass(cls, builtin)
    assert getattr(gantools, name) is cls and getattr(importlib.import_module(f"gantools.{old_home}"), name) is cls
    with pytest.raises(gantools.GantoolsError):
        raise cls("something to fix")
