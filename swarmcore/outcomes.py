"""How a microbatch's iteration ended at its origin: the one vocabulary of the peers' counts,
the progress records, the coordinator's summaries and both sides' metrics.

A `str` enum: each member is its own wire/JSON/metrics value, so records and labels stay as
they were when these were plain strings.
"""
from enum import StrEnum


class Outcome(StrEnum):
    COMPLETED = "completed"           # on its planned route
    REROUTED = "rerouted"             # a replica stood in for a failed hop
    SKIPPED_STAGE = "skipped_stage"   # a failed hop's stage was skipped
    REISSUED = "reissued"             # sent again from stage 0 on a fresh route
    LOST = "lost"                     # not trained this iteration (and reported)


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)   # in reporting order
