"""Suite-wide settings."""
import pytest
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2 --dist loadgroup` (the README's command): every test under tests/swarm in one group,
    run one after another on one worker, while the unit and integration tests spread over both.
    Two swarms at once starve each other into timeouts on 2 cores, and a module's shared swarm
    (a module-scoped fixture) must not be started on both workers. A scheduler rather than
    xdist_group marks: pytest 9 builds node ids in a way xdist's mark-to-group renaming misses."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmTestsInOneGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/swarm" if nodeid.startswith("tests/swarm/") else nodeid
    return SwarmTestsInOneGroup(config, log)
