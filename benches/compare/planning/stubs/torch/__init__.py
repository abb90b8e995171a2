"""Import stub for the benchmark (see benches/compare/planning/stubs/README.md): not torch."""

from . import cuda, nn, utils  # noqa: F401


class Tensor:
    pass


class device:  # noqa: N801 (torch's name)
    def __init__(self, *args, **kwargs):
        self.args = args


def is_tensor(value):
    return isinstance(value, Tensor)
