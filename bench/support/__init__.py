"""What the benchmarks run swarms with; the tests use it too. Nothing in bench/ imports tests/.

- memory_swarm: an in-process swarm over the in-memory transport (real worker and handlers)
- harness: an in-process coordinator plus peer subprocesses on 127.0.0.1
- rogue, soak: a hostile participant (run as `python -m bench.support.rogue`) and its launcher
- netns_swarm: a coordinator and peers started inside network namespaces (bench/netns.py)
"""
