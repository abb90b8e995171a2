"""Import stub (see benches/compare/planning/stubs/README.md): the base classes dynabatch
subclasses or names at import time. `Sampler` is an empty generic base, as in torch."""

from typing import Generic, TypeVar

T = TypeVar("T")


class Sampler(Generic[T]):
    def __init__(self, data_source=None):
        pass


class Dataset(Generic[T]):
    pass


class DataLoader:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torch stub: DataLoader is not available in the planning benchmark")
