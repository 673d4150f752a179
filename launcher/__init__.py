"""`skippipe-swarm`: starts a whole local swarm (the coordinator in-process, the peers as
subprocesses) for demos, tests and benchmarks. Uses coordinator/ and peer/'s declarations;
nothing imports it."""
