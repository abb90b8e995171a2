"""Import stub (see bench/planning/stubs/README.md)."""


class Module:
    pass
