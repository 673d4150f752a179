"""DT-FM's data-parallel pipelines for the `full` baseline: one chain of nodes per microbatch.

Stage by stage, every chain is extended by the replica of the next stage with the cheapest
round trip (activation there, gradient back) from the chain's last node, cheapest pairs
first, with each replica taking at most ceil(chains / replicas) chains: where a stage has as
many replicas as there are data nodes, each data node's microbatches share one pipeline as in
DT-FM, and extra replicas still get work. (A greedy choice per microbatch, least-loaded
first, let one origin's poor pick push the other's microbatches onto a far replica.) Pure.
"""
import math


def pipeline_chains(stage_of: list[int], num_stages: int, round_trip: list[list[float]],
                    origins: list[int]) -> list[list[int]]:
    """One chain [origin, stage-1 node, ..., stage-(S-1) node] per entry of `origins` (a
    microbatch's data node); `round_trip[a][b]` is the cost of the a <-> b link."""
    chains = [[o] for o in origins]
    for st in range(1, num_stages):
        replicas = [n for n, s in enumerate(stage_of) if s == st]
        cap = math.ceil(len(chains) / len(replicas))
        served = dict.fromkeys(replicas, 0)
        pairs = sorted((round_trip[chain[-1]][n], i, n) for i, chain in enumerate(chains) for n in replicas)
        for _, i, n in pairs:
            if len(chains[i]) == st and served[n] < cap:
                chains[i].append(n)
                served[n] += 1
    return chains
