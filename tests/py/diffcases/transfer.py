"""Moving bytes in bulk: sendfile from a regular file, splice between the
socket and a pipe, large transfers both ways at once, many small writes,
and a large blocking send against a reader that takes little at a time."""
import hashlib
import os
import socket
import tempfile
import time

from diffcases import case

FILE_SIZE = 100000


def pattern(n, seed=0):
    unit = bytes((i * 7 + seed) % 251 for i in range(4096))
    return (unit * (n // len(unit) + 1))[:n]


def temp_file(size=FILE_SIZE, seed=1):
    """A regular file of size patterned bytes, its position at 0."""
    fd, path = tempfile.mkstemp(prefix="smclo-diff-")
    os.unlink(path)
    os.write(fd, pattern(size, seed))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def position(fd):
    return os.lseek(fd, 0, os.SEEK_CUR)


def read_exactly(s, n, chunk=65536):
    h, got = hashlib.sha1(), 0
    while got < n:
        d = s.recv(min(chunk, n - got))
        if not d:
            break
        h.update(d)
        got += len(d)
    return got, h.hexdigest()[:16]


# -- sendfile ------------------------------------------------------------------

@case
class sendfile_whole_file:
    """Offset None: sendfile reads from the file's position and moves it."""
    def server(e):
        f = temp_file()
        e.do("sendfile", os.sendfile, e.sock.fileno(), f, None, 1 << 20)
        e.log("position", position(f))
        e.do("sendfile-at-end", os.sendfile, e.sock.fileno(), f, None, 1000)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("read")

    def client(e):
        got = e.recv_all()
        e.log("equal", got == pattern(FILE_SIZE, 1))
        e.sync("read")


@case
class sendfile_offset_and_count:
    """An explicit offset leaves the file's position alone; a count past
    the end sends what there is."""
    def server(e):
        f = temp_file()
        os.lseek(f, 10, os.SEEK_SET)
        e.do("sendfile", os.sendfile, e.sock.fileno(), f, 1000, 5000)
        e.log("position", position(f))
        e.do("sendfile-tail", os.sendfile, e.sock.fileno(), f, FILE_SIZE - 300, 5000)
        e.log("position", position(f))
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("read")

    def client(e):
        got = e.recv_all()
        whole = pattern(FILE_SIZE, 1)
        e.log("equal", got == whole[1000:6000] + whole[-300:])
        e.sync("read")


@case
class sendfile_count_zero:
    def server(e):
        f = temp_file()
        e.do("sendfile", os.sendfile, e.sock.fileno(), f, 0, 0)
        e.do("sendfile-pos", os.sendfile, e.sock.fileno(), f, None, 0)
        e.log("position", position(f))
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        e.do("recv", e.sock.recv, 100, socket.MSG_DONTWAIT)
        e.sync("read")


@case
class sendfile_offset_past_end:
    def server(e):
        f = temp_file()
        e.do("sendfile-at-end", os.sendfile, e.sock.fileno(), f, FILE_SIZE, 100)
        e.do("sendfile-past-end", os.sendfile, e.sock.fileno(), f, 2 * FILE_SIZE, 100)
        os.lseek(f, 3 * FILE_SIZE, os.SEEK_SET)
        e.do("sendfile-pos-past-end", os.sendfile, e.sock.fileno(), f, None, 100)
        e.log("position", position(f))
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        e.do("recv", e.sock.recv, 100, socket.MSG_DONTWAIT)
        e.sync("read")


@case
class sendfile_to_slow_reader:
    """4 MB, more than the socket buffer holds: a blocking sendfile waits
    for the reader and sends it all."""
    def server(e):
        f = temp_file(4 << 20, 2)
        e.do("sendfile", os.sendfile, e.sock.fileno(), f, 0, 4 << 20)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("read")

    def client(e):
        time.sleep(0.3)
        h, n = hashlib.sha1(), 0
        while True:
            d = e.sock.recv(4096)
            if not d:
                break
            h.update(d)
            n += len(d)
            if n % (1 << 20) < 4096:
                time.sleep(0.02)
        e.log("read", n, h.hexdigest() == hashlib.sha1(pattern(4 << 20, 2)).hexdigest())
        e.sync("read")


# -- splice --------------------------------------------------------------------

def pipe():
    """A pipe whose read end does not block: reading what splice put there
    never hangs a case whose splice put nothing."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    return r, w


@case
class splice_socket_to_pipe:
    def server(e):
        e.sync("sent")
        r, w = pipe()
        e.do("splice", os.splice, e.sock.fileno(), w, 300)
        e.do("splice", os.splice, e.sock.fileno(), w, 4096)
        e.do("pipe", os.read, r, 8192)
        e.do("recv", e.sock.recv, 100, socket.MSG_DONTWAIT)
        e.sync("read")

    def client(e):
        e.sock.sendall(pattern(1000, 3))
        e.sync("sent")
        e.sync("read")


@case
class splice_pipe_to_socket:
    def server(e):
        r, w = os.pipe()
        os.write(w, pattern(1000, 4))
        e.do("splice", os.splice, r, e.sock.fileno(), 400)
        e.do("splice", os.splice, r, e.sock.fileno(), 4096)
        os.close(w)
        e.do("splice-pipe-eof", os.splice, r, e.sock.fileno(), 4096)
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        e.do("recv", e.sock.recv, 4096)
        e.do("recv", e.sock.recv, 4096, socket.MSG_DONTWAIT)
        e.sync("read")


@case
class splice_nonblock_flag_on_blocking_socket:
    """SPLICE_F_NONBLOCK makes only the pipe non-blocking: on a blocking
    socket with nothing to read splice waits for data."""
    def server(e):
        r, w = pipe()
        e.sync("start")
        e.do("splice", os.splice, e.sock.fileno(), w, 4096, None, None, os.SPLICE_F_NONBLOCK,
             timed=True)
        e.do("pipe", os.read, r, 100)
        e.sync("read")

    def client(e):
        e.sync("start")
        time.sleep(0.4)
        e.sock.sendall(b"late")
        e.sync("read")


@case
class splice_nonblocking_socket_empty:
    def server(e):
        r, w = pipe()
        e.sock.setblocking(False)
        e.do("splice", os.splice, e.sock.fileno(), w, 4096, timed=True)
        e.do("splice-nb", os.splice, e.sock.fileno(), w, 4096, None, None, os.SPLICE_F_NONBLOCK,
             timed=True)
        e.sync("start")
        e.sync("sent")
        e.do("splice", os.splice, e.sock.fileno(), w, 4096)
        e.do("pipe", os.read, r, 100)
        e.sync("read")

    def client(e):
        e.sync("start")
        e.sock.sendall(b"now")
        e.sync("sent")
        e.sync("read")


@case
class splice_after_peer_fin:
    def server(e):
        r, w = pipe()
        e.sync("fin")
        e.do("splice", os.splice, e.sock.fileno(), w, 4096)
        e.do("splice", os.splice, e.sock.fileno(), w, 4096)
        e.do("splice-again", os.splice, e.sock.fileno(), w, 4096, timed=True)
        e.do("pipe", os.read, r, 100)
        e.sync("read")

    def client(e):
        e.sock.sendall(b"bye")
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("fin")
        e.sync("read")


# -- volume --------------------------------------------------------------------

BOTH_WAYS = 16 << 20


def both_ways(e, mine, theirs):
    """Send 16 MB from a thread while this thread reads the peer's 16 MB."""
    sent = []
    th = e.thread(lambda: sent.append(e.sock.sendall(pattern(BOTH_WAYS, mine))))
    n, digest = read_exactly(e.sock, BOTH_WAYS)
    th.join(15)
    e.log("sent", sent == [None])
    want = hashlib.sha1(pattern(BOTH_WAYS, theirs)).hexdigest()[:16]
    e.log("received", n, digest, digest == want)
    e.sync("done")


@case
class sixteen_mb_each_way_at_once:
    def server(e):
        both_ways(e, 5, 6)

    def client(e):
        both_ways(e, 6, 5)


@case
class ten_thousand_small_writes:
    def server(e):
        sizes = set()
        for i in range(10000):
            sizes.add(e.sock.send(b"%09d\n" % i))
        e.log("send-results", sorted(sizes))
        e.sock.close()
        e.sync("read")

    def client(e):
        got = e.recv_all()
        e.log("equal", got == b"".join(b"%09d\n" % i for i in range(10000)))
        e.sync("read")


@case
class blocking_8mb_send_small_reads:
    """One blocking send of 8 MB while the reader takes 1 byte at a time,
    then 64 KB at a time."""
    def server(e):
        e.do("send", e.sock.send, pattern(8 << 20, 7))
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("read")

    def client(e):
        h, sizes = hashlib.sha1(), set()
        for _ in range(2000):
            d = e.sock.recv(1)
            sizes.add(len(d))
            h.update(d)
        e.log("one-byte-reads", sorted(sizes))
        n = 2000
        while True:
            d = e.sock.recv(65536)
            if not d:
                break
            h.update(d)
            n += len(d)
        e.log("read", n, h.hexdigest() == hashlib.sha1(pattern(8 << 20, 7)).hexdigest())
        e.sync("read")
