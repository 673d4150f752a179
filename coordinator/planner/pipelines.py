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
    replicas: dict[int, list[int]] = {}
    for node, st in enumerate(stage_of):
        replicas.setdefault(st, []).append(node)
    for st in range(1, num_stages):
        if replicas.get(st) and chains:
            _extend(chains, rt, replicas[st], math.ceil(len(chains) / len(replicas[st])))
    return chains


def _extend(chains: list[list[int]], rt: np.ndarray, nodes: list[int], cap: int) -> None:
    """Append one of `nodes` to every chain, cheapest (cost, chain, replica) first, at most `cap`
    chains a replica. Chains that end on the same node share one sorted row and one heap entry:
    the lowest-numbered of them still unserved."""
    groups: dict[int, list[int]] = {}
    for i, chain in enumerate(chains):
        groups.setdefault(chain[-1], []).append(i)
    lasts = list(groups)
    # [group, replica]; sorted in Python (stable: ties go to the lower replica), as these rows are
    # a handful of values and numpy's per-call overhead was most of the partition search's time
    rows = rt[np.asarray(lasts)[:, None], np.asarray(nodes)[None, :]].tolist()
    order = [sorted(range(len(nodes)), key=row.__getitem__) for row in rows]
    sorted_costs = [[row[j] for j in o] for row, o in zip(rows, order)]
    members = [groups[a] for a in lasts]
    served, pos, nxt = [0] * len(nodes), [0] * len(lasts), [0] * len(lasts)
    heap = [(row[0], members[g][0], g) for g, row in enumerate(sorted_costs)]
    heapq.heapify(heap)
    while heap:
        cost, _, g = heapq.heappop(heap)
        j = order[g][pos[g]]
        if served[j] < cap:
            # the group's next chains take j too while its entry would stay the heap's least
            # (the same order as one pop per chain, without the pops)
            while True:
                chains[members[g][nxt[g]]].append(nodes[j])
                served[j] += 1
                nxt[g] += 1
                if nxt[g] == len(members[g]) or served[j] == cap:
                    break
                if heap and heap[0] < (cost, members[g][nxt[g]], g):
                    break
            if nxt[g] == len(members[g]):
                continue
        else:                                   # full for good: the group's next replica
            pos[g] += 1
            if pos[g] == len(nodes):
                continue
        heapq.heappush(heap, (sorted_costs[g][pos[g]], members[g][nxt[g]], g))
