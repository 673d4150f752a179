"""Suite-wide settings."""
import pytest
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)


# Swarm modules that start no swarm of their own (DHT nodes, one in-process peer, the fork
# server, two idle peers): they load the machine little more than a unit test does, so they run
# beside the swarm group, on whichever worker is free, instead of lengthening the group that
# sets the suite's wall time.
LIGHT_SWARM_MODULES = frozenset(f"tests/swarm/{name}.py" for name in (
    "test_fuzz_rpc", "test_dht_security", "test_invitations", "test_membership", "test_fork_server"))


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2 --dist loadgroup` (the README's command): the tests under tests/swarm (but the light
    modules above) in one group, run one after another on one worker, while the unit and
    integration tests spread over both.
    Two swarms at once starve each other into timeouts on 2 cores, and a module's shared swarm
    (a module-scoped fixture) must not be started on both workers. A scheduler rather than
    xdist_group marks: pytest 9 builds node ids in a way xdist's mark-to-group renaming misses."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmTestsInOneGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in LIGHT_SWARM_MODULES:
                return module          # one scope per module: a module-scoped fixture starts once
            return "tests/swarm" if nodeid.startswith("tests/swarm/") else nodeid
    return SwarmTestsInOneGroup(config, log)
