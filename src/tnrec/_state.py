"""Per-step attributes of a ``torch.nn.Module``, written without ``Module.__setattr__``.

``Module.__setattr__`` checks every write for parameters, buffers and
submodules (about 1 µs a write); a training step writes a dozen attributes of
the model and its layers that are none of those (the step's batch, its
temporary matrices, flags). :func:`set_state` writes them straight into the
instance's ``__dict__``, which is where ``Module.__setattr__`` puts such values
too, so reading them back is unchanged.
"""

from __future__ import annotations

from typing import Any


def set_state(module: Any, **values: Any) -> None:
    """Set plain attributes of ``module`` (never a parameter, buffer or submodule)."""
    module.__dict__.update(values)
