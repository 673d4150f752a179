"""Suite-wide settings."""
import pytest
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)


# Swarm modules whose tests neither train a swarm on the loopback nor time anything that a busy
# box stretches (a fuzzed peer, DHT admission, namespaced NAT pairs): a second group, run last on
# the worker that ran the unit tests, beside the training swarms (issue 23: one group held every
# swarm test and was the suite's whole critical path on 2 cores: 604-639 s)
LIGHT_SWARM_MODULES = ("test_fuzz_rpc", "test_invitations", "test_join_key", "test_nat")
SWARM, LIGHT_SWARM = "tests/swarm", "tests/swarm-light"


def swarm_group(nodeid: str) -> str | None:
    """The xdist group of a test under tests/swarm (None: any other test, scheduled one by one)."""
    if not nodeid.startswith("tests/swarm/"):
        return None
    module = nodeid.split("/")[2].split(".py")[0]
    return LIGHT_SWARM if module in LIGHT_SWARM_MODULES else SWARM


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2 --dist loadgroup` (the README's command): the training swarms under tests/swarm in
    one group, run one after another on one worker from the start, while the unit and
    integration tests run on the other, then the light swarm group there. Two training swarms
    at once starve each other into timeouts on 2 cores (tried: a late-joiner's and an identity
    check's timings broke), and a module's shared swarm (a module-scoped fixture) must not be
    started on both workers. A scheduler rather than xdist_group marks: pytest 9 builds node ids
    in a way xdist's mark-to-group renaming misses."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return swarm_group(nodeid) or nodeid

        def _assign_work_unit(self, node) -> None:
            # the largest scope (the training swarms) goes out first; the light group waits until
            # only it is left, so that it runs after the unit tests instead of beside them
            if LIGHT_SWARM in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(LIGHT_SWARM)
            super()._assign_work_unit(node)
    return SwarmGroups(config, log)
