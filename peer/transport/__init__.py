"""Moving protocol frames between peers: hivemind P2P streams, or in-memory for tests."""
