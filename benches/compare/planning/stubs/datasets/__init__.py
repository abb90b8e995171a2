"""Import stub (see benches/compare/planning/stubs/README.md)."""


class Dataset:
    @classmethod
    def from_list(cls, *args, **kwargs):
        raise RuntimeError("datasets stub: not available in the planning benchmark")
