"""Finding the run and the other peers through the hivemind DHT."""
