"""A tiny asyncio HTTP/1.1 server for status pages and /metrics: GET and HEAD only, one
request per connection, bounded request size, read/write timeouts and a connection cap, so
a slow or hostile client cannot tie up the process it watches."""
import asyncio
import logging
from typing import Awaitable, Callable
from urllib.parse import urlsplit

logger = logging.getLogger("skippipe.http")
Response = tuple[int, str, bytes]                    # status, content type, body
Route = Callable[[], Response | Awaitable[Response]]
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


def text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class StatusServer:
    def __init__(self, routes: dict[str, Route], host: str = "127.0.0.1", port: int = 0,
                 max_request_bytes: int = 8192, timeout_s: float = 5.0, max_connections: int = 32):
        self.routes, self.host, self.port = routes, host, port
        self.max_request_bytes, self.timeout_s = max_request_bytes, timeout_s
        self.max_connections, self.active = max_connections, 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port. Raises OSError (say, the port is taken)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=self.max_request_bytes)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.active += 1
        try:
            if self.active > self.max_connections:
                response, head_only = text(503, "too many connections\n"), False
            else:
                response, head_only = await self._respond(reader)
            await asyncio.wait_for(self._write(writer, response, head_only), self.timeout_s)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self.active -= 1
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except asyncio.LimitOverrunError:
            return text(413, "request too large\n"), False
        except TimeoutError:
            return text(408, "request timed out\n"), False
        except asyncio.IncompleteReadError:
            return text(400, "incomplete request\n"), False
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return text(400, "malformed request line\n"), False
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD are supported\n"), False
        route = self.routes.get(urlsplit(target).path)
        if route is None:
            return text(404, f"no such page; try {', '.join(sorted(self.routes))}\n"), method == "HEAD"
        try:
            response = route()
            if asyncio.iscoroutine(response):
                response = await response
        except Exception:
            logger.exception("status page %s failed", target)
            response = text(500, "internal error (see the process log)\n")
        return response, method == "HEAD"

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response, head_only: bool) -> None:
        status, content_type, body = response
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")
        writer.write(head.encode("latin-1") + (b"" if head_only else body))
        await writer.drain()
