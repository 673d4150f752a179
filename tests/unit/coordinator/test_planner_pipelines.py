"""DT-FM pipelines for the full baseline, and the same partition search for every strategy."""
import random

from coordinator.planner import PlanConfig, PlannerConfig, plan
from coordinator.planner.pipelines import pipeline_chains
from coordinator.planner.presets import make_topology

INF = 1e9


def matrix(n, costs):
    m = [[INF] * n for _ in range(n)]
    for (a, b), c in costs.items():
        m[a][b] = m[b][a] = c
    return m


def test_cheapest_pairs_first_instead_of_first_come():
    # origins 0 and 1; stage-1 replicas 2 and 3. Origin 0 first come would take 2 (cost 2) and
    # push origin 1 onto 3 (cost 10); the cheapest pair (1, 2) goes first instead.
    rt = matrix(4, {(0, 2): 2, (0, 3): 3, (1, 2): 1, (1, 3): 10})
    assert pipeline_chains([0, 0, 1, 1], 2, rt, [0, 1]) == [[0, 3], [1, 2]]


def test_every_chain_visits_every_stage_in_order_and_replicas_share_the_load():
    rng = random.Random(3)
    n, stages = 11, 4
    stage_of = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3]
    rt = [[0.0 if a == b else rng.uniform(1, 9) for b in range(n)] for a in range(n)]
    origins = [o for o in (0, 1, 2) for _ in range(4)]
    chains = pipeline_chains(stage_of, stages, rt, origins)
    assert [c[0] for c in chains] == origins
    assert all([stage_of[x] for x in c] == list(range(stages)) for c in chains)
    for st in range(1, stages):
        replicas = [x for x, s in enumerate(stage_of) if s == st]
        served = [sum(c[st] == r for c in chains) for r in replicas]
        assert max(served) <= -(-len(chains) // len(replicas))     # ceil(chains / replicas)
        assert sum(served) == len(chains)


def test_one_pipeline_per_data_node_where_stages_have_as_many_replicas():
    stage_of = [0, 0, 1, 1, 2, 2]
    rt = matrix(6, {(0, 2): 1, (0, 3): 5, (1, 2): 5, (1, 3): 1, (2, 4): 1, (2, 5): 5, (3, 4): 5, (3, 5): 1})
    chains = pipeline_chains(stage_of, 3, rt, [0, 0, 0, 1, 1, 1])
    assert chains == [[0, 2, 4]] * 3 + [[1, 3, 5]] * 3


def test_the_full_pipeline_gets_the_same_partition_search_as_skippipe():
    t = make_topology("geo", 12, random.Random(2))
    one = plan(t, PlanConfig(strategy="full", planner=PlannerConfig(partitions=1)), 5)
    three = plan(t, PlanConfig(strategy="full", planner=PlannerConfig(partitions=3)), 5)
    assert three.predicted_iteration_s <= one.predicted_iteration_s   # the first candidate is shared
    stage_of, load = three.stage_of(), {}
    for r in three.routes:
        assert r.stages == tuple(range(6))
        for h in r.hops[1:]:
            load[h.peer] = load.get(h.peer, 0) + 1
    for st in range(1, 6):                    # the replicas of a stage share its microbatches
        replicas = [p for p, x in stage_of.items() if x == st]
        assert max(load.get(p, 0) for p in replicas) <= -(-len(three.routes) // len(replicas))
        assert min(load.get(p, 0) for p in replicas) > 0


def _sorted_scan(stage_of, num_stages, rt, origins):
    """The rule as first written: every (cost, chain, replica) triple in sorted order."""
    chains = [[o] for o in origins]
    for st in range(1, num_stages):
        replicas = [n for n, s in enumerate(stage_of) if s == st]
        cap = -(-len(chains) // len(replicas))
        served = dict.fromkeys(replicas, 0)
        for _, i, n in sorted((rt[c[-1]][n], i, n) for i, c in enumerate(chains) for n in replicas):
            if len(chains[i]) == st and served[n] < cap:
                chains[i].append(n)
                served[n] += 1
    return chains


def test_the_heap_merge_gives_the_chains_of_the_sorted_scan_ties_included():
    for trial in range(60):
        rng = random.Random(trial)
        n, stages = rng.randint(6, 30), rng.randint(2, 6)
        stage_of = list(range(stages)) + [rng.randrange(stages) for _ in range(n - stages)]
        rng.shuffle(stage_of)
        whole = trial % 2 == 0                      # small integer costs: many exact ties
        rt = [[0.0 if a == b else float(rng.randint(1, 3)) if whole else rng.uniform(1, 9) for b in range(n)]
              for a in range(n)]
        origins = [o for o in range(n) if stage_of[o] == 0 for _ in range(rng.randint(1, 5))]
        assert pipeline_chains(stage_of, stages, rt, origins) == _sorted_scan(stage_of, stages, rt, origins), trial
