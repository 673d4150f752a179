"""Suite-wide settings."""
import pytest
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)


# The swarm tests form two groups, each run one after another on one worker: these files (about
# a third of the swarm tests' time, small swarms without timing asserts) on the second worker,
# before its share of the unit tests; the rest on the first. With one group the swarm tests
# (~700 s one after another) ran on long after the other worker had done the unit tests (~400 s).
SECOND_SWARM_GROUP = frozenset({
    "test_clean_stop.py", "test_dht_security.py", "test_fuzz_rpc.py", "test_invitations.py",
    "test_join_key.py", "test_membership.py", "test_nat.py", "test_swarm_cli.py",
})


def swarm_group(nodeid: str) -> str | None:
    """The group a test runs in, or None for a unit or integration test (its own scope)."""
    if not nodeid.startswith("tests/swarm/"):
        return None
    file = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return "tests/swarm (second group)" if file in SECOND_SWARM_GROUP else "tests/swarm"


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """`-n 2 --dist loadgroup` (the README's command): the swarm tests in two groups (above), each
    run one after another on one worker, the unit and integration tests spread over both as
    they come free. A group is one scope, so xdist's scope reordering (largest first) hands the
    two groups out first, one to each worker. More than one swarm per worker starves them into
    timeouts on 2 cores, and a module's shared swarm (a module-scoped fixture) must not be
    started on both workers. A scheduler rather than xdist_group marks: pytest 9 builds node ids
    in a way xdist's mark-to-group renaming misses."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmTestsInTwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return swarm_group(nodeid) or nodeid
    return SwarmTestsInTwoGroups(config, log)
