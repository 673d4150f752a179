"""The pipeline's tunables, shared by the worker and its collaborators (sender, recovery,
averaging, state sync, spot checks)."""
from dataclasses import dataclass


@dataclass
class WorkerSettings:
    max_activations: int = 8
    rpc_timeout_s: float = 30.0
    iteration_timeout_s: float = 120.0
    send_deadline_s: float = 30.0
    heartbeat_s: float = 0.5          # how often we check on peers that owe us work
    ping_timeout_s: float = 2.0
    hop_deadline_floor_s: float = 4.0 # per hop ahead; the rest is measured (hop_deadlines.py)
    hop_late_s: float = 15.0          # a peer that missed a hop deadline gets no new work this long
    extra_skips: int = 1              # recovery skip budget (k > 0 only), see routing/fallback.py
    spot_check_rate: float = 0.0      # share of forwards recomputed elsewhere, see spot_checks.py
    share_dtype: str = "int8"         # gradient shares on the wire (share_codec.py); float32: exact
    wire_compression: str = "auto"    # activations/gradients between hops (wire.py): auto follows the schedule
