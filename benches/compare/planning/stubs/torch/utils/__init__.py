"""Import stub (see benches/compare/planning/stubs/README.md)."""

from . import data  # noqa: F401
