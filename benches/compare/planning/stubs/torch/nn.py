"""Import stub (see benches/compare/planning/stubs/README.md)."""


class Module:
    pass
