"""The cases of the differential suite (test_differential.py, diffpeer.py).

A case is a class with two functions, server(e) and client(e), each given
its End (diffpeer.py): e.sock is the connection, e.log() and e.do() write
the trace, e.sync() is a barrier with the other end.  Class attributes
change what the harness does:

    family    socket.AF_INET6 for a case over ::1
    accepts   False: the server accepts by itself (e.listener)
    connects  False: the client connects by itself (e.port)
    conns     connections accelerated at each end, the harness's first
              one included (2 by default)
    dies      an end is killed: its connection may never have been counted
    fallbacks the fall-backs `smclo stats` must show ({} by default)
    expect    {path: what the totals show instead}: "inbox" for a direct
              path that cannot be (a non-blocking listener), "after-timeout"
              for a rendezvous that waits for an accept() made late
    paths     the smclo handshake paths to run it on

The modules are grouped by what they exercise; a case's name is its class
name with dashes.
"""
CASES = {}


def case(cls):
    name = cls.__name__.replace("_", "-")
    assert name not in CASES, name
    CASES[name] = cls
    return cls


def add(name, server, client, **attrs):
    """A case made from two functions (families of cases in a loop)."""
    return case(type(name, (), dict(attrs, server=staticmethod(server),
                                    client=staticmethod(client))))


from diffcases import (connect, io, vectors, transfer, shutdown, close, killed,  # noqa: E402,F401
                       readiness, timeouts, options, ioctls, signals, urgent, fds)
