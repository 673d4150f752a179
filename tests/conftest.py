"""Suite-wide settings."""
import pytest
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)


# Swarm modules that start no training swarm of their own, or one in network namespaces with a
# few peers: they run as a second group, beside the training swarms of the first (issue 23: the
# suite's 10 minutes on 2 cores; one group held every swarm test and was the whole critical path)
LIGHT_SWARM_MODULES = ("test_fuzz_rpc", "test_dht_security", "test_membership", "test_invitations",
                       "test_join_key", "test_nat", "test_netns")


def swarm_group(nodeid: str) -> str | None:
    """The xdist group of a test under tests/swarm (None: any other test, scheduled one by one)."""
    if not nodeid.startswith("tests/swarm/"):
        return None
    module = nodeid.split("/")[2].split(".py")[0]
    return "tests/swarm-light" if module in LIGHT_SWARM_MODULES else "tests/swarm"


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2 --dist loadgroup` (the README's command): the tests under tests/swarm in two groups
    (training swarms; light and namespaced ones), each run one after another on one worker, while
    the unit and integration tests fill in around them. xdist hands out the largest groups first,
    so the two groups start at once, one per worker. Three training swarms at once starve each
    other into timeouts on 2 cores, and a module's shared swarm (a module-scoped fixture) must not
    be started on both workers. A scheduler rather than xdist_group marks: pytest 9 builds node
    ids in a way xdist's mark-to-group renaming misses."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmTestsInTwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return swarm_group(nodeid) or nodeid
    return SwarmTestsInTwoGroups(config, log)
