"""A stand-in for the few torch calls scripts/kl/hf_kld_base.py makes, for scripts/kl/test_kld_writer.sh on
machines without torch (nested python lists; no arithmetic). Not a torch."""
__version__ = "fake"
float32 = "float32"
long = "int64"


class _NS:
    pass


backends = _NS()
backends.cuda = _NS()
backends.cuda.matmul = _NS()
backends.cudnn = _NS()
cuda = _NS()
cuda.is_available = lambda: False


def set_float32_matmul_precision(p):
    pass


def set_num_threads(n):
    pass


class no_grad:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class Tensor:
    def __init__(self, data):
        self.data = data

    def _shape(self, d):
        return [len(d)] + self._shape(d[0]) if isinstance(d, list) else []

    @property
    def shape(self):
        return self._shape(self.data)

    def __getitem__(self, i):
        return Tensor(self.data[i])

    def to(self, *a, **k):
        return self

    def cpu(self):
        return self

    def tolist(self):
        return self.data

    def numpy(self):
        import numpy
        return numpy.asarray(self.data, dtype=numpy.float32)


def tensor(data, dtype=None, device=None):
    return Tensor(data)
