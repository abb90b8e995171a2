"""Import stub (see benches/compare/planning/stubs/README.md)."""


class OutOfMemoryError(RuntimeError):
    pass


def is_available():
    return False


def empty_cache():
    pass


def synchronize():
    pass
