"""Starting hivemind's DHT so that its child process survives large records (peer/,
coordinator/, tests and benches share this).

hivemind 1.1.12 sends every DHT call to its child process through a socketpair. The child
watches its end with uvloop's add_reader, which puts that socket in non-blocking mode, then
reads each call with a plain blocking-style `recv()`. A call whose pickled arguments exceed
the socket buffer (~200 KB here: a progress record with many reports, a large advert) then
arrives in pieces: `recv()` raises BlockingIOError mid-message, the stream is out of step,
and the child dies with EOFError a moment later. Every DHT call of that process then times
out and the swarm stalls. The parent still holds the same socket (same open file
description), so switching it back to blocking once the child is up fixes it for the child.

Use: `dht = safe_for_large_calls(DHT(start=True, ...))` (a started, ready DHT: by then the
child has called add_reader).
"""
import os


def safe_for_large_calls(dht):
    """The started hivemind DHT `dht`, its command pipe switched back to blocking."""
    pipe = getattr(dht, "_inner_pipe", None)
    if pipe is not None and not pipe.closed:
        os.set_blocking(pipe.fileno(), True)
    return dht
