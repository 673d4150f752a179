"""opsweb.server: the bounded GET-only HTTP server behind the status page and /metrics."""
import asyncio

import pytest

from opsweb.server import StatusServer, text


async def exchange(port: int, raw: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.fixture
async def server():
    calls = []

    async def slow_json():
        await asyncio.sleep(0)
        return 200, "application/json", b'{"ok": true}'

    def boom():
        raise RuntimeError("broken route")

    srv = StatusServer({"/": lambda: (calls.append(1), text(200, "hello"))[1], "/api": slow_json, "/boom": boom},
                       max_request_bytes=1024, timeout_s=0.5, max_connections=4)
    await srv.start()
    srv.calls = calls
    yield srv
    await srv.close()


async def test_get_routes_and_query_strings(server):
    status, headers, body = await exchange(server.port, b"GET /?refresh=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b"hello")
    assert headers["Content-Length"] == "5" and headers["Connection"] == "close"
    status, headers, body = await exchange(server.port, b"GET /api HTTP/1.0\r\n\r\n")
    assert status == 200 and headers["Content-Type"] == "application/json" and body == b'{"ok": true}'


async def test_head_has_no_body(server):
    status, headers, body = await exchange(server.port, b"HEAD / HTTP/1.1\r\n\r\n")
    assert status == 200 and headers["Content-Length"] == "5" and body == b""


@pytest.mark.parametrize("raw,expected", [
    (b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"GET /nope HTTP/1.1\r\n\r\n", 404),
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET / SPDY/3\r\n\r\n", 400),
])
async def test_bad_requests_get_clear_errors(server, raw, expected):
    status, _, body = await exchange(server.port, raw)
    assert status == expected and body
    assert server.calls == []   # the route never ran


async def test_oversized_request_is_refused(server):
    status, _, _ = await exchange(server.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    assert status == 413


async def test_stalled_client_times_out(server):
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _, _ = await exchange(server.port, b"GET / HTTP/1.1\r\n")   # never finishes its headers
    assert status == 408 and loop.time() - started < 5.0


async def test_failing_route_is_a_500_not_a_crash(server):
    status, _, body = await exchange(server.port, b"GET /boom HTTP/1.1\r\n\r\n")
    assert status == 500 and b"internal error" in body
    assert (await exchange(server.port, b"GET / HTTP/1.1\r\n\r\n"))[0] == 200   # still serving


async def test_connection_cap(server):
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
    await asyncio.sleep(0.05)
    status, _, _ = await exchange(server.port, b"GET / HTTP/1.1\r\n\r\n")
    assert status == 503
    for _, w in idle:
        w.close()


async def test_close_frees_the_port():
    srv = StatusServer({"/": lambda: text(200, "x")})
    port = await srv.start()
    assert srv.url == f"http://127.0.0.1:{port}/"
    await srv.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
