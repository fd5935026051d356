"""The backend names, defined once.

``Backend`` is the type of every ``prefer=`` / ``backend=`` argument; :data:`BACKENDS` is
derived from it, and :func:`check_backend` is the one validation of a name.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

__all__ = ["BACKENDS", "Backend", "check_backend"]

Backend = Literal["auto", "kvikio", "zarr-gpu", "cpu"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)


def check_backend(name: object) -> Backend:
    """Return ``name`` as a :data:`Backend`, or raise ValueError listing the valid names."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    return cast(Backend, name)
