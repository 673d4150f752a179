"""Typed configuration of the coordinator's `run` mode (filled from CLI flags)."""
from dataclasses import dataclass

from coordinator.planner.costs import Overheads


@dataclass(frozen=True)
class CoordinatorConfig:
    run: str = "default"
    model: str = "tiny"
    model_config: str = ""                  # full architecture JSON for a config.json model ("" = preset)
    num_stages: int = 3
    skip_ratio: float = 0.0
    strategy: str = "skippipe"
    seed: int = 0
    max_steps: int = 0                      # 0 = train until stopped
    microbatch_samples: int = 4
    seq_len: int = 64
    microbatches_per_origin: int = 4
    global_batch: int = 0                   # microbatches per iteration, whoever computes them; 0 = per origin
    gradient_exchange: str = "sync"         # --gradient-exchange: RunSpec.gradient_exchange
    learning_rate: float = 3e-3
    warmup_steps: int = 5
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    serve_relay: bool = False               # relay for peers behind NAT (swarmcore/relay.py)
    initial_peers: tuple[str, ...] = ()
    min_peers: int = 0                      # wait for this many peers before the first plan
    poll_interval_s: float = 1.0
    switch_margin_s: float = 4.0            # a new epoch starts this far (in iterations' time) after publication
    replan_hold_s: float = 1.0              # membership must be stable this long (hysteresis)
    lost_after_s: float = 3.0               # an origin missing from the adverts this long lost its microbatches
    status_port: int | None = None          # HTTP status page + /metrics; None: off, 0: any free port
    status_host: str = "127.0.0.1"          # 0.0.0.0 to show the page to other machines
    maddrs_file: str = ""                   # write the multiaddrs peers join with here (scripts, compose)
    organiser_key_path: str = ""            # signs the spec and schedules; "" = a new key each start
    members_path: str = ""                  # invitations and bans (coordinator/members.py); "" = none
    join_key_path: str = ""                 # require this join secret of peers ("" = open run); created if missing
    checkpoint_dir: str = ""                # the peers' checkpoints, if visible here: the data cursor resumes
    data_dir: str = ""                      # a dataset folder (tokendata); "" = the embedded corpus
    tokenizer: str = ""                     # byte | bpe (embedded corpus; "" = byte) or the dataset's own
    overheads: Overheads = Overheads()      # the planner's fixed swarm costs (planner/costs.py); zero: links + compute
    wire_compression: str = "off"           # --wire-compression: the links the schedule quantises (planner/costs.py)
