"""A DHT record validator that refuses records expiring too far ahead (issue 24).

hivemind keeps, per key and subkey, the value that expires last. A stranger who stores a record
expiring in 30 days therefore outlives every honest refresh of that key for a month. With this
validator in every member's DHT node, such a store is refused at honest nodes, and a value that
comes back from a lookup with such an expiry is dropped. Our own records expire within an hour.

Duck-typed against hivemind's RecordValidatorBase (validate, sign_value, strip_value, priority,
merge_with): it needs nothing but the standard library.
"""
import time

MAX_EXPIRY_AHEAD_S = 2 * 3600.0     # twice the longest TTL we use (spec and schedules: 1 h)


class ExpiryBound:
    def __init__(self, max_ahead_s: float = MAX_EXPIRY_AHEAD_S, clock=time.time):
        self.max_ahead_s = max_ahead_s
        self.clock = clock       # hivemind's DHT time is the wall clock (get_dht_time)

    def validate(self, record) -> bool:
        return record.expiration_time <= self.clock() + self.max_ahead_s

    def sign_value(self, record) -> bytes:
        return record.value

    def strip_value(self, record) -> bytes:
        return record.value

    @property
    def priority(self) -> int:
        return 10        # checked first when validating (decreasing priority): cheapest

    def merge_with(self, other) -> bool:
        return False
