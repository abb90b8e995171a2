"""Import stub (see bench/planning/stubs/README.md)."""

from . import data  # noqa: F401
