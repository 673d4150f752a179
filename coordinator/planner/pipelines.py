"""DT-FM's data-parallel pipelines for the `full` baseline: one chain of nodes per microbatch.

Stage by stage, every chain is extended by the replica of the next stage with the cheapest
round trip (activation there, gradient back) from the chain's last node, cheapest pairs
first, with each replica taking at most ceil(chains / replicas) chains: where a stage has as
many replicas as there are data nodes, each data node's microbatches share one pipeline as in
DT-FM, and extra replicas still get work. (A greedy choice per microbatch, least-loaded
first, let one origin's poor pick push the other's microbatches onto a far replica.) Pure.

"Cheapest pairs first" is the scan of every (cost, chain, replica) triple in sorted order that
skips served chains and full replicas; it runs as a merge of the chains' own sorted rows in a
heap (a full replica stays full, so a chain only ever moves on to its next replica), which gives
the same chains without sorting chains x replicas triples per stage (the partition search calls
this thousands of times: it was 97% of the full pipeline's planning at 200 nodes).
"""
import heapq
import math

import numpy as np


def pipeline_chains(stage_of: list[int], num_stages: int, round_trip, origins: list[int]) -> list[list[int]]:
    """One chain [origin, stage-1 node, ..., stage-(S-1) node] per entry of `origins` (a
    microbatch's data node); `round_trip[a][b]` is the cost of the a <-> b link (nested lists
    or a 2-D array)."""
    rt = np.asarray(round_trip, dtype=float)
    chains = [[o] for o in origins]
    stage_arr = np.asarray(stage_of)
    for st in range(1, num_stages):
        replicas = np.flatnonzero(stage_arr == st)
        if len(replicas) and chains:
            _extend(chains, rt, replicas.tolist(), math.ceil(len(chains) / len(replicas)))
    return chains


def _extend(chains: list[list[int]], rt: np.ndarray, nodes: list[int], cap: int) -> None:
    """Append one of `nodes` to every chain, cheapest (cost, chain, replica) first, at most `cap`
    chains a replica. Chains that end on the same node share one sorted row and one heap entry:
    the lowest-numbered of them still unserved."""
    groups: dict[int, list[int]] = {}
    for i, chain in enumerate(chains):
        groups.setdefault(chain[-1], []).append(i)
    lasts = list(groups)
    costs = rt[np.ix_(lasts, nodes)]                                     # [group, replica]
    order = np.argsort(costs, axis=1, kind="stable")                      # ties: lower replica first
    sorted_costs = np.take_along_axis(costs, order, axis=1).tolist()
    order = order.tolist()
    members = [groups[a] for a in lasts]
    served, pos, nxt = [0] * len(nodes), [0] * len(lasts), [0] * len(lasts)
    heap = [(row[0], members[g][0], g) for g, row in enumerate(sorted_costs)]
    heapq.heapify(heap)
    while heap:
        _, i, g = heapq.heappop(heap)
        j = order[g][pos[g]]
        if served[j] < cap:
            chains[i].append(nodes[j])
            served[j] += 1
            nxt[g] += 1
            if nxt[g] == len(members[g]):
                continue
        else:                                   # full for good: the group's next replica
            pos[g] += 1
            if pos[g] == len(nodes):
                continue
        heapq.heappush(heap, (sorted_costs[g][pos[g]], members[g][nxt[g]], g))
