"""What the coordinator, the peer and the launcher share beyond the wire contract: the DHT
record layer, the path rules, the schedule history, the run flags and the console scripts'
conventions (settings, logging, one-line errors).

Depends on protocol/ (and third-party libraries) only; peer/ and coordinator/ import it, it
imports neither. Kept free of imports here, so that a CLI that needs only the flags does not
pull in hivemind.
"""
