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
from pathlib import Path

VIA_RING, VIA_COPY = 1, 2


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Span(ctypes.Structure):
    _fields_ = [("iov", _Iovec * 2), ("len", ctypes.c_size_t), ("via", ctypes.c_int)]


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
        ("smclo_via", ctypes.c_int, [ctypes.c_int])):
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
