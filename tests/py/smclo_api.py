"""The native API (include/smclo.h) from Python, through ctypes: what the
matrix's API rows (matrix_client.py --api, matrix_server.py api-*) use.

Under `smclo run` the library is already loaded (LD_PRELOAD) and its
symbols are found in the process; without it, the build's libsmclo.so is
loaded, as a program linked with -lsmclo would have it (its wrappers are
then not in front of libc's, so every connection takes the copy path).
"""
import ctypes
import errno
import os
import select
from pathlib import Path

VIA_RING, VIA_COPY, VIA_POOL = 1, 2, 3
CQE_F_MORE, CQE_F_NOTIF, CQE_F_COPIED, CQE_F_RECLAIMED = 1, 2, 4, 8


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Span(ctypes.Structure):
    _fields_ = [("iov", _Iovec * 2), ("len", ctypes.c_size_t), ("via", ctypes.c_int)]


class Cqe(ctypes.Structure):
    _fields_ = [("user_data", ctypes.c_ulonglong), ("res", ctypes.c_longlong),
                ("flags", ctypes.c_uint), ("count", ctypes.c_uint)]


def _library():
    me = ctypes.CDLL(None, use_errno=True)
    if hasattr(me, "smclo_send_claim"):
        return me
    build = Path(os.environ.get("SMCLO_BUILD", Path(__file__).resolve().parents[2] / "build"))
    return ctypes.CDLL(str(build / "libsmclo.so"), use_errno=True)


lib = _library()
for name, res, args in (
        ("smclo_send_claim", ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_size_t,
                                                ctypes.POINTER(Span), ctypes.c_int]),
        ("smclo_send_commit", ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]),
        ("smclo_recv_peek", ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_size_t,
                                               ctypes.POINTER(Span), ctypes.c_int]),
        ("smclo_recv_consume", ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
        ("smclo_via", ctypes.c_int, [ctypes.c_int]),
        ("smclo_pool_create", ctypes.c_void_p, [ctypes.c_int, ctypes.c_size_t, ctypes.c_uint,
                                                ctypes.c_int]),
        ("smclo_pool_get", ctypes.c_void_p, [ctypes.c_void_p]),
        ("smclo_pool_put", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        ("smclo_pool_send", ctypes.c_ssize_t, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_ulonglong, ctypes.c_int]),
        ("smclo_reap", ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(Cqe), ctypes.c_uint]),
        ("smclo_pool_fd", ctypes.c_int, [ctypes.c_void_p]),
        ("smclo_pool_destroy", ctypes.c_int, [ctypes.c_void_p])):
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args


def _check(r):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def sendall(fd, data):
    """Send @data through claims of the send ring (or staging), in place."""
    view, off, span = memoryview(data), 0, Span()
    while off < len(view):
        n = _check(lib.smclo_send_claim(fd, 1, ctypes.byref(span), 0))
        n = min(n, len(view) - off)
        first = min(n, span.iov[0].len)
        ctypes.memmove(span.iov[0].base, bytes(view[off:off + first]), first)
        if n > first:
            ctypes.memmove(span.iov[1].base, bytes(view[off + first:off + n]), n - first)
        if _check(lib.smclo_send_commit(fd, n, 0)) != n:
            raise OSError(errno.EIO, "commit sent part of its bytes")
        off += n


def recv(fd, limit=1 << 16):
    """Up to @limit bytes read in place and consumed; b"" at the end."""
    span = Span()
    n = _check(lib.smclo_recv_peek(fd, 1, ctypes.byref(span), 0))
    if n == 0:
        return b""
    n = min(n, limit)
    first = min(n, span.iov[0].len)
    out = ctypes.string_at(span.iov[0].base, first)
    if n > first:
        out += ctypes.string_at(span.iov[1].base, n - first)
    _check(lib.smclo_recv_consume(fd, n))
    return out


def via(fd):
    return _check(lib.smclo_via(fd))


class Pool:
    """A buffer pool of connection @fd (smclo_pool_create): sendall() fills
    its buffers and sends them (by reference once the peer mapped the pool),
    waiting on the pool's descriptor for buffers to come back."""

    def __init__(self, fd, size=1 << 16, nbufs=4, wait_s=30):
        self.p = lib.smclo_pool_create(fd, size, nbufs, 0)
        if not self.p:
            _check(-1)
        self.size, self.wait_s = size, wait_s
        self.copied = self.by_reference = self.reclaimed = 0

    def reap(self):
        cqes = (Cqe * 16)()
        while True:
            n = _check(lib.smclo_reap(self.p, cqes, 16))
            for c in cqes[:n]:
                if c.flags & CQE_F_NOTIF:
                    if c.flags & CQE_F_RECLAIMED:
                        self.reclaimed += c.count
                    elif c.flags & CQE_F_COPIED:
                        self.copied += c.count
                    else:
                        self.by_reference += c.count
            if n < 16:
                return

    def _buffer(self):
        while True:
            b = lib.smclo_pool_get(self.p)
            if b:
                return b
            if ctypes.get_errno() != errno.ENOBUFS:
                _check(-1)
            p = select.poll()
            p.register(lib.smclo_pool_fd(self.p), select.POLLIN)
            if not p.poll(self.wait_s * 1000):
                raise OSError(errno.ETIMEDOUT, "no pool buffer came back")
            self.reap()

    def sendall(self, data):
        view, off = memoryview(data), 0
        while off < len(view):
            b = self._buffer()
            n = min(self.size, len(view) - off)
            ctypes.memmove(b, bytes(view[off:off + n]), n)
            r = lib.smclo_pool_send(self.p, b, n, off, 0)
            if r < 0:
                e = ctypes.get_errno()
                lib.smclo_pool_put(self.p, b)
                raise OSError(e, os.strerror(e))
            off += r
            self.reap()

    def close(self):
        lib.smclo_pool_destroy(self.p)
