"""Hostile-input defences of a peer: identity, membership, DHT record guards, admission limits
and the pure pieces of spot checks. See docs/security.md."""
