"""A hostile peer: speaks smclo's handshake from plain Python (no smclo
library), then abuses what it was given.  Layouts follow clc.h and ring.h.

    hostile.py server REGISTRY PORT ATTACK   pose as an smclo server
    hostile.py client REGISTRY PORT ATTACK   pose as an smclo client

ATTACK (server): pool-valid    - hand over a sealed pool, then one honest
                                 reference to "hello" in it (the control)
                 pool-forged   - the same pool, then a reference past its end
                 pool-unsealed - a pool that could shrink, then a reference
                 pool-writable - sealed but for writes through new mappings
                                 (which allow punching holes), then a reference
                 pool-hugetlb  - a hugetlbfs pool, whose holes fault with
                                 SIGBUS, then a reference
                 pool-eventfd  - the wake-up descriptor an eventfd (whose
                                 O_NONBLOCK the peer can clear), then a reference
                 pool-full-wake - a valid pool whose wake-up socket (blocking)
                                 has no room left, then an honest reference
                                 to it anyway
                 prod      - publish an impossible producer cursor, ring
                 stale-bell - send a byte, then (once it is read) a doorbell
                              for it again, then a second byte: an honest
                              peer's doorbell that arrived late
                 cons      - publish a consumer cursor beyond what was sent
                 proof     - answer with somebody else's TCP socket as proof
                 inbox-prod   - take an offer from our inbox, then publish an
                                impossible producer cursor
                 inbox-silent - read the offer and never decide it
                 inbox-junk   - set the offer word to a value that decides nothing
                 direct-silent - pose as a listener taking connections without
                                 TCP, read the offer and never decide it
                 forge:SECONDS - another user's port: write a live entry for it
                                 naming inboxes of ours (listening on nothing),
                                 then count what reaches them
                 forge-any:SECONDS - listen on 0.0.0.0:PORT ourselves, with an
                                 entry for 0.0.0.0 naming our inboxes: an entry
                                 the kernel vouches for, but for every address,
                                 other hosts' too; count what reaches them
                 squat:SPORT:SECONDS - bind the rendezvous of the connection
                                 from 127.0.0.1:SPORT to the port, then count
                                 what reaches it
ATTACK (client): silent    - take the rendezvous ACCEPT and never confirm;
                             print how long the server waited (ms)
                 unsealed  - CONFIRM with a region that could be shrunk
                 size      - CONFIRM with a region of the wrong size
                 prod      - a valid region, then an impossible producer cursor
                 inbox-pipe     - an offer whose "socket pair" end is a pipe
                 inbox-unsealed - an offer whose region could be shrunk
                 inbox-junk     - a malformed offer, then a plain connect
                 direct-proof   - an offer without TCP whose "TCP socket" is a
                                  UDP one, then a plain connect
                 direct-junk    - a malformed offer without TCP, then a plain connect
"""
import fcntl
import mmap
import os
import select
import socket
import struct
import sys
import time

CLC_MAGIC, CLC_VERSION = 0x434C4353, 2
ACCEPT, CONFIRM, DECLINE, OFFER, DIRECT = 2, 3, 4, 5, 6
RING_MAGIC, RING_VERSION, HDR = 0x4F4C4D53, 2, 4096
# struct ring_hdr (src/proto/ring.h): offsets within a ring header
PROD, CONS, BELL_SEQ, BELL_VAL = 64, 128, 256, 272
REF_PROD, POOL_ACK, OFFER_WORD, REFS = 88, 216, 576, 640
OFFER_OPEN, OFFER_TAKEN = 1, 3
INBOX_ID, DIRECT_ID = 0x5eed, 0xd1ec7
SO_NETNS_COOKIE = 71
F_OFD_SETLK = 37


def netns(sock):
    return struct.unpack("Q", sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]


def ip_hex(ip):
    return (b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)).hex()


def accept_msg(msg_type, nonce, ring_size, rx_max, ns, dst=None):
    body = struct.pack("<IIIIQ", os.getpid(), ring_size, rx_max, 0, ns)
    if dst:                                   # a CLC_DIRECT names where it connects to
        body += bytes.fromhex(ip_hex(dst[0])) + struct.pack("<H6x", dst[1])
    return struct.pack("<IBBHQ", CLC_MAGIC, msg_type, CLC_VERSION, 16 + len(body), nonce) + body


def parse(msg):
    magic, mtype, _ver, length, nonce = struct.unpack_from("<IBBHQ", msg)
    assert magic == CLC_MAGIC and length == len(msg)
    if mtype == DECLINE:
        return mtype, nonce, struct.unpack_from("<I", msg, 16)
    return mtype, nonce, struct.unpack_from("<IIIIQ", msg, 16)


def ring_hdr(size):
    return struct.pack("<IIII", RING_MAGIC, RING_VERSION, size, HDR)


def poke(region, off, fmt, value):
    struct.pack_into(fmt, region, off, value)


def announce_listener(reg, port, ns, inbox=0, direct=0, ip="127.0.0.1"):
    """A listener entry as smclo writes it, locked for as long as we live."""
    for sub in ("l", "p", "c", "i"):
        os.makedirs(os.path.join(reg, sub), mode=0o700, exist_ok=True)
    name = "%u.%016x.%s.0.%d.%016x.%016x.%u.%u.%08x" % (port, ns, ip_hex(ip),
                                                        os.getpid(), inbox, direct,
                                                        1 << 16, 1 << 16, 1)
    fd = os.open(os.path.join(reg, "l", name), os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    return fd


def inbox_server(reg, port, attack):
    """Pose as a listening smclo process with an inbox; abuse the offer."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    lock = announce_listener(reg, port, netns(ls), INBOX_ID)
    box = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    box.bind(os.path.join(reg, "i", "%d.%016x" % (os.getpid(), INBOX_ID)))
    print("ready", flush=True)
    c, _ = ls.accept()
    box.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(box, 256, 4)
    mtype, _, (_pid, up, down, _, _) = parse(msg)
    assert mtype == OFFER and len(fds) == 3, (mtype, fds)
    _tcp, pair_fd, region_fd = fds
    region = mmap.mmap(region_fd, 2 * HDR + up + down)
    pair = socket.socket(fileno=pair_fd)
    if attack == "inbox-silent":
        print("silent", flush=True)
        c.sendall(c.recv(100))                # the client times out, goes on over TCP
        time.sleep(1)
        return
    if attack == "inbox-junk":
        poke(region, OFFER_WORD, "<I", 0x7777)
        print("junk", flush=True)
        c.sendall(c.recv(100))
        time.sleep(1)
        return
    poke(region, OFFER_WORD, "<I", OFFER_TAKEN)
    print("taken", flush=True)
    pair.recv(1, socket.MSG_PEEK)                         # the client's first doorbell
    down_hdr = HDR + up
    poke(region, down_hdr + PROD, "<Q", 1 << 62)            # our producer cursor
    poke(region, down_hdr + BELL_SEQ, "<Q", 1)                 # one doorbell counted
    pair.send(b"")
    time.sleep(3)
    os.close(lock)


def direct_server(reg, port, attack):
    """Pose as a listener that takes connections without TCP; never decide."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    lock = announce_listener(reg, port, netns(ls), INBOX_ID, DIRECT_ID)
    boxes = []
    for ident in (INBOX_ID, DIRECT_ID):
        boxes.append(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
        boxes[-1].bind(os.path.join(reg, "i", "%d.%016x" % (os.getpid(), ident)))
    print("ready", flush=True)
    boxes[1].settimeout(5)
    msg, fds, _, _ = socket.recv_fds(boxes[1], 256, 4)
    assert parse(msg)[0] == DIRECT and len(fds) == 3, (msg, fds)
    print("silent", flush=True)
    c, _ = ls.accept()                    # the client gave up and connected over TCP
    c.sendall(c.recv(100))
    time.sleep(1)
    os.close(lock)


def forge_server(reg, port, attack):
    """Claim someone else's listener: an entry for @port naming our inbox and
    direct inbox; report every message that reaches either."""
    probe = socket.socket()
    ip = "127.0.0.1"
    if attack.startswith("forge-any:"):
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", port))
        probe.listen(4)
        ip = "0.0.0.0"
    lock = announce_listener(reg, port, netns(probe), INBOX_ID, DIRECT_ID, ip)
    boxes = []
    for ident in (INBOX_ID, DIRECT_ID):
        boxes.append(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
        path = os.path.join(reg, "i", "%d.%016x" % (os.getpid(), ident))
        boxes[-1].bind(path)
        os.chmod(path, 0o777)             # as smclo's own inboxes in a shared registry
    print("ready", flush=True)
    count_received(boxes, float(attack.split(":")[1]))
    os.close(lock)


def squat_server(reg, port, attack):
    """Bind the rendezvous of a connection we are no end of."""
    _, sport, seconds = attack.split(":")
    box = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(reg, "p", "%u-%u-%s" % (port, int(sport), ip_hex("127.0.0.1")))
    box.bind(path)
    os.chmod(path, 0o777)
    print("ready", flush=True)
    count_received([box], float(seconds))


def count_received(boxes, seconds):
    got = fds = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        for b in select.select(boxes, [], [], 0.05)[0]:
            _, passed, _, _ = socket.recv_fds(b, 4096, 8, socket.MSG_DONTWAIT)
            got, fds = got + 1, fds + len(passed)
            for f in passed:
                os.close(f)
    print("received", got, "messages", fds, "descriptors", flush=True)


def server(reg, port, attack):
    if attack.startswith(("forge:", "forge-any:")):
        return forge_server(reg, port, attack)
    if attack.startswith("squat:"):
        return squat_server(reg, port, attack)
    if attack.startswith("inbox-"):
        return inbox_server(reg, port, attack)
    if attack.startswith("direct-"):
        return direct_server(reg, port, attack)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    lock = announce_listener(reg, port, netns(ls))
    print("ready", flush=True)
    c, (_, cport) = ls.accept()
    key = "%u-%u-%s" % (port, cport, ip_hex("127.0.0.1"))
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proof = c
    if attack == "proof":                # a TCP socket of ours, but not this connection
        other = socket.create_connection(("127.0.0.1", port))
        proof, _ = ls.accept()
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.sendmsg([accept_msg(ACCEPT, 7, 1 << 20, 1 << 20, netns(c))],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                struct.pack("ii", theirs.fileno(), proof.fileno()))],
              0, os.path.join(reg, "p", key))
    theirs.close()
    mine.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(mine, 256, 4)
    mtype, _, fields = parse(msg)
    if mtype != CONFIRM:
        print("declined", fields[0], flush=True)
        c.sendall(c.recv(100))               # the client went on over TCP: answer there
        time.sleep(1)
        return
    _pid, up, down, _, _ = fields
    region = mmap.mmap(fds[0], 2 * HDR + up + down)
    down_hdr = HDR + up
    print("confirmed", flush=True)
    mine.recv(1, socket.MSG_PEEK)                         # the client's first doorbell
    if attack == "prod":
        poke(region, down_hdr + PROD, "<Q", 1 << 62)        # our producer cursor
        poke(region, down_hdr + BELL_SEQ, "<Q", 1)             # one doorbell counted
    elif attack == "cons":
        poke(region, down_hdr + CONS, "<Q", 1 << 40)       # consumed more than sent
    elif attack == "stale-bell":
        return stale_bell(region, down_hdr, mine, lock)
    elif attack.startswith("pool-"):
        return pool_attack(region, down_hdr, mine, lock, attack)
    mine.send(b"")                                        # ring
    time.sleep(3)
    os.close(lock)


def stale_bell(region, down_hdr, mine, lock):
    """A byte with its doorbell; once the client has read it, a doorbell
    for it again (what a writer preempted between counting and sending
    one delivers late); then a second byte with its doorbell."""
    data = down_hdr + HDR

    def ring(seq, val):
        poke(region, down_hdr + BELL_VAL + 8 * (seq % 32), "<Q", val)   # bell_val[seq]
        poke(region, down_hdr + BELL_SEQ, "<Q", seq + 1)                 # bell_seq
        mine.send(b"")

    region[data] = ord("a")
    poke(region, down_hdr + PROD, "<Q", 1)                  # producer cursor
    ring(0, 1)
    deadline = time.time() + 5
    while struct.unpack_from("<Q", region, CONS)[0] != 1 and time.time() < deadline:
        time.sleep(0.01)                                  # the client's consumer cursor
    time.sleep(0.3)                                       # it waits for more now
    ring(1, 1)                                            # late: its byte is read
    print("stale", flush=True)
    time.sleep(0.3)
    region[data + 1] = ord("b")
    poke(region, down_hdr + PROD, "<Q", 2)
    ring(2, 2)
    time.sleep(5)
    os.close(lock)


F_ADD_SEALS, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_FUTURE_WRITE = 1033, 1, 2, 4, 16


def pool_attack(region, down_hdr, mine, lock, attack):
    """Hand the client a pool with a doorbell, as smclo's pool.c does, wait
    for its acknowledgement, then put one reference into our stream."""
    size = 2 << 20 if attack == "pool-hugetlb" else 65536
    hugetlb = os.MFD_HUGETLB if attack == "pool-hugetlb" else 0
    pool = os.memfd_create("hostile-pool", os.MFD_ALLOW_SEALING | hugetlb)
    os.ftruncate(pool, size)
    if not hugetlb:                                       # hugetlbfs has no write()
        os.pwrite(pool, b"hello", 0)
    seals = {"pool-unsealed": 0,
             "pool-writable": F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL}.get(
        attack, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
    if seals:
        fcntl.fcntl(pool, F_ADD_SEALS, seals)
    if attack == "pool-eventfd":
        wake = os.eventfd(0)                              # blocks once its counter is full
    else:
        keep, wake = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if attack == "pool-full-wake":
            # the victim's release messages have no room: its send must
            # not wait (the descriptor is blocking, and shared with us)
            try:
                while True:
                    wake.send(b"x", socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        wake = wake.detach()
    poke(region, down_hdr + BELL_VAL, "<Q", 0)                 # bell_val[0]: producer 0
    poke(region, down_hdr + BELL_SEQ, "<Q", 1)                 # bell_seq
    socket.send_fds(mine, [b""], [pool, wake])
    deadline = time.time() + 3
    while struct.unpack_from("<I", region, POOL_ACK)[0] != 1 and time.time() < deadline:
        time.sleep(0.01)                                  # the client's pool_ack
    print("ack", struct.unpack_from("<I", region, POOL_ACK)[0], flush=True)
    off = size - 3 if attack == "pool-forged" else 0      # 5 bytes: 2 past the end
    struct.pack_into("<QII", region, down_hdr + REFS, 0, off, 5)
    poke(region, down_hdr + REF_PROD, "<Q", 1)
    region[down_hdr + HDR] = 0                            # the placeholder byte
    poke(region, down_hdr + PROD, "<Q", 1)                  # producer cursor
    poke(region, down_hdr + BELL_VAL + 8, "<Q", 1)             # bell_val[1]
    poke(region, down_hdr + BELL_SEQ, "<Q", 2)
    mine.send(b"")
    time.sleep(3)
    os.close(lock)


def find_inbox(reg, port, field=5):
    """The inbox (field 5) or the direct inbox (field 6) a listener entry names."""
    for name in os.listdir(os.path.join(reg, "l")):
        f = name.split(".")
        if int(f[0]) == port and int(f[field], 16):
            return "%s.%s" % (f[4], f[field])
    raise SystemExit("no inbox for port %d" % port)


def inbox_client(reg, port, attack):
    """Send a bad offer to a real server's inbox (or direct inbox), then connect."""
    c = socket.socket()
    direct = attack.startswith("direct-")
    up = down = 1 << 16
    mfd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(mfd, 2 * HDR + up + down)
    region = mmap.mmap(mfd, 2 * HDR + up + down)
    region[0:16] = ring_hdr(up)
    region[HDR + up:HDR + up + 16] = ring_hdr(down)
    poke(region, OFFER_WORD, "<I", OFFER_OPEN)
    if attack != "inbox-unsealed":
        fcntl.fcntl(mfd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pipe_r, _pipe_w = os.pipe()
    pair_fd = pipe_r if attack == "inbox-pipe" else theirs.fileno()
    msg = accept_msg(OFFER, 0, up, down, netns(c))
    proof = c
    if attack == "inbox-junk":
        msg = msg[:-3]                                   # truncated
    if direct:
        msg = accept_msg(DIRECT, 0, up, down, netns(c), ("127.0.0.1", port))
        if attack == "direct-junk":
            msg = msg[:-3]
        proof = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        proof.bind(("127.0.0.1", 0))
    box = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    box.connect(os.path.join(reg, "i", find_inbox(reg, port, 6 if direct else 5)))
    socket.send_fds(box, [msg], [proof.fileno(), pair_fd, mfd])
    if not direct:
        count_in_state(reg, STATE_OFFERS_SENT, 1)
    c.connect(("127.0.0.1", port))
    deadline = time.time() + 2
    while struct.unpack_from("<I", region, OFFER_WORD)[0] == OFFER_OPEN and time.time() < deadline:
        time.sleep(0.01)
    word = struct.unpack_from("<I", region, OFFER_WORD)[0]
    print("word", word & 0xff, word >> 8, flush=True)
    c.sendall(b"hello")                                  # the server stayed on TCP: it echoes
    c.settimeout(5)
    print("echo", c.recv(100).decode(), flush=True)


STATE_RENDEZVOUS_BOUND, STATE_OFFERS_SENT = 0, 8       # registry.c struct registry_state


def count_in_state(reg, offset, delta):
    """Add @delta to a counter of the registry's shared page (registry.h):
    clients count themselves in before binding a rendezvous, and count an
    offer once it is queued in an inbox; servers skip the lookup or the
    inbox while the counts say there is nothing for them."""
    fd = os.open(os.path.join(reg, "state3"), os.O_RDWR | os.O_CREAT, 0o600)
    if os.fstat(fd).st_size < 4096:
        os.ftruncate(fd, 4096)
    with mmap.mmap(fd, 4096) as m:
        (n,) = struct.unpack_from("<q", m, offset)
        struct.pack_into("<q", m, offset, n + delta)   # one client: no race to lose
    os.close(fd)


def client(reg, port, attack):
    if attack.startswith("inbox-") or attack.startswith("direct-"):
        return inbox_client(reg, port, attack)
    count_in_state(reg, STATE_RENDEZVOUS_BOUND, 1)
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    c.bind(("127.0.0.1", 0))
    key = "%u-%u-%s" % (port, c.getsockname()[1], ip_hex("127.0.0.1"))
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.bind(os.path.join(reg, "p", key))
    c.connect(("127.0.0.1", port))
    d.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(d, 256, 4)
    os.unlink(os.path.join(reg, "p", key))
    mtype, nonce, fields = parse(msg)
    assert mtype == ACCEPT and len(fds) == 2, (mtype, fds)
    pair = socket.socket(fileno=fds[0])
    if attack == "silent":                   # never confirm: how long is the server held?
        t0 = time.monotonic()
        pair.settimeout(5)
        pair.recv(1)
        print("held", int((time.monotonic() - t0) * 1000), flush=True)
        return
    up = down = 1 << 16
    length = 2 * HDR + up + down
    if attack == "size":
        length += 4096
    mfd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(mfd, length)
    region = mmap.mmap(mfd, length)
    region[0:16] = ring_hdr(up)
    region[HDR + up:HDR + up + 16] = ring_hdr(down)
    if attack != "unsealed":
        fcntl.fcntl(mfd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    socket.send_fds(pair, [accept_msg(CONFIRM, nonce, up, down, netns(c))], [mfd, c.fileno()])
    if attack == "prod":
        poke(region, PROD, "<Q", 1 << 62)      # our producer cursor: far beyond the ring
        poke(region, BELL_SEQ, "<Q", 1)
        pair.send(b"")
    pair.settimeout(5)
    try:
        left = pair.recv(1)                  # the server hangs up on us
        print("pair", "closed" if left == b"" else "open", flush=True)
    except (socket.timeout, ConnectionResetError) as e:
        print("pair", type(e).__name__, flush=True)


if __name__ == "__main__":
    role, reg, port, attack = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    os.makedirs(reg, mode=0o700, exist_ok=True)
    os.chdir(reg)                       # short socket paths, relative to the registry
    (server if role == "server" else client)(".", port, attack)
