"""The run's DHT schema as both sides use it: the record validators every node installs and
the timed get/store of records (keys from protocol.ids, values protocol messages)."""
