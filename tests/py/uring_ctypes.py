"""An io_uring driven through liburing from Python (ctypes), as a C program
drives it: liburing's exported functions looked up in the process's global
scope (where smclo's stand in front of them), its inline ones written out
here (filling a submission, marking a completion seen).  For the test
servers of the conformance matrix (matrix_server.py: iouring-files,
iouring-socket)."""
import ctypes
import os

_lib = ctypes.CDLL("liburing.so.2", mode=ctypes.RTLD_GLOBAL)
_g = ctypes.CDLL(None)          # the global scope: LD_PRELOAD first
for _name, _args in (("io_uring_queue_init", [ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]),
                     ("io_uring_get_sqe", [ctypes.c_void_p]),
                     ("io_uring_submit", [ctypes.c_void_p]),
                     ("__io_uring_get_cqe", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                             ctypes.c_uint, ctypes.c_void_p]),
                     ("io_uring_queue_exit", [ctypes.c_void_p])):
    getattr(_g, _name).argtypes = _args
_g.io_uring_get_sqe.restype = ctypes.c_void_p
_get_cqe = getattr(_g, "__io_uring_get_cqe")   # not mangled inside a class

OP_READ, OP_SEND, OP_RECV = 22, 26, 27
CQ_KHEAD = 104                  # offsetof(struct io_uring, cq.khead), liburing 2.x


class Ring:
    def __init__(self, entries=8):
        self.mem = ctypes.create_string_buffer(256)    # struct io_uring (216 bytes)
        self.ring = ctypes.addressof(self.mem)
        r = _g.io_uring_queue_init(entries, self.ring, 0)
        if r < 0:
            raise OSError(-r, "io_uring_queue_init")

    def _do(self, op, fd, addr, length, off=0):
        sqe = _g.io_uring_get_sqe(self.ring)
        ctypes.memset(sqe, 0, 64)
        ctypes.c_uint8.from_address(sqe).value = op
        ctypes.c_int32.from_address(sqe + 4).value = fd
        ctypes.c_uint64.from_address(sqe + 8).value = off
        ctypes.c_uint64.from_address(sqe + 16).value = addr
        ctypes.c_uint32.from_address(sqe + 24).value = length
        _g.io_uring_submit(self.ring)
        cqe = ctypes.c_void_p()
        r = _get_cqe(self.ring, ctypes.byref(cqe), 0, 1, None)
        if r < 0:
            raise OSError(-r, "io_uring wait")
        res = ctypes.c_int32.from_address(cqe.value + 8).value
        khead = ctypes.c_void_p.from_address(self.ring + CQ_KHEAD).value
        ctypes.c_uint32.from_address(khead).value += 1      # io_uring_cqe_seen
        if res < 0:
            raise OSError(-res, os.strerror(-res))
        return res

    def read(self, fd, n, off=0):
        buf = ctypes.create_string_buffer(n)
        got = self._do(OP_READ, fd, ctypes.addressof(buf), n, off)
        return buf.raw[:got]

    def recv(self, fd, n):
        buf = ctypes.create_string_buffer(n)
        got = self._do(OP_RECV, fd, ctypes.addressof(buf), n)
        return buf.raw[:got]

    def send(self, fd, data):
        buf = ctypes.create_string_buffer(data, len(data))
        return self._do(OP_SEND, fd, ctypes.addressof(buf), len(data))

    def close(self):
        _g.io_uring_queue_exit(self.ring)
