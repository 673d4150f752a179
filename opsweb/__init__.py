"""Small stdlib-only operator web pieces shared by the coordinator and the peer: a bounded
GET-only HTTP/1.1 server (server.py) and Prometheus text exposition (prom.py).

A package of its own because coordinator/ and peer/ may not import each other and protocol/
may not use asyncio; it imports nothing of ours and nothing outside the standard library."""
