"""The flags that describe a training run, declared once for `skippipe-coordinator run` and
`skippipe-swarm` (the launcher), so both read them alike: same names, types, defaults, help.

Three defaults follow the launcher's role and are declared here beside the shared ones
(LAUNCHER_DEFAULTS): a local demo ends (20 iterations, where a coordinator runs until
stopped), it names its run "local" (its checkpoints are named after the run, so earlier local
runs resume), and it serves no status page unless asked (several local swarms, such as the
test suite's, share one machine and would fight over the port).
"""
import argparse

from protocol.messages import GRADIENT_EXCHANGES
from protocol.quantised import WIRE_COMPRESSION
from swarmcore.cli.settings import port_or_off
from swarmcore.cli.support import DEFAULT_SKIP, learning_rate, non_negative_int, positive_int, run_name, skip_ratio
from swarmcore.path_rules import STRATEGIES

WIRE_COMPRESSION_HELP = (
    "activations and their gradients between hops: auto (the planner compresses, per link, where "
    "transmission outweighs compute), off (float, bit-for-bit as before protocol 1.6), int8 or int4 "
    "(blockwise quantised, a float scale per 64 values, and an offset for int4 activations: ~3.8x or "
    "~6.5x fewer bytes) on every link; a peer older than protocol 1.6 always gets floats. A peer with "
    "auto sends what the coordinator's schedule says; the coordinator's default stays off until auto's "
    "speed-up on slow links is established (docs/results.md) (default: %(default)s)")

# chosen by measurement (docs/results.md: bench/convergence.py and bench/swarm_vs_full.py)
DEFAULT_GRADIENT_EXCHANGE = "sync"
DEFAULT_STATUS_PORT = 8321
COORDINATOR, LAUNCHER = "coordinator", "launcher"
COORDINATOR_DEFAULTS = {"run": "default", "steps": 0, "status_port": DEFAULT_STATUS_PORT}
LAUNCHER_DEFAULTS = {"run": "local", "steps": 20, "status_port": None}


def add_run_flags(p: argparse.ArgumentParser, role: str = COORDINATOR) -> None:
    """The run's flags on `p`; `role` picks the launcher's own defaults (LAUNCHER_DEFAULTS)."""
    if role not in (COORDINATOR, LAUNCHER):
        raise ValueError(f"role must be {COORDINATOR!r} or {LAUNCHER!r}, got {role!r}")
    launcher = role == LAUNCHER
    own = LAUNCHER_DEFAULTS if launcher else COORDINATOR_DEFAULTS
    p.add_argument("--run", type=run_name, default=own["run"],
                   help="run name peers join with --run (default: %(default)s)")
    p.add_argument("--model", default="tiny", metavar="NAME|config.json",
                   help="model preset (tiny, small, 500m, 1.5b) or a Hugging Face LlamaConfig config.json (default: tiny)")
    p.add_argument("--stages", type=positive_int, default=3, help="pipeline stages (default: 3)")
    p.add_argument("--skip", type=skip_ratio, default=skip_ratio(DEFAULT_SKIP), metavar="K",
                   help=f"skip ratio k in [0, 1), e.g. 0.33 or 1/3; 0 is the full pipeline (default: {DEFAULT_SKIP})")
    p.add_argument("--strategy", choices=STRATEGIES, default="skippipe")
    add_data_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed for model init, data and planning")
    if launcher:   # a local swarm always ends: it prints a summary and stops its peers
        p.add_argument("--steps", type=positive_int, default=own["steps"], help="training iterations (default: %(default)s)")
    else:
        p.add_argument("--steps", type=non_negative_int, default=own["steps"], help="iterations to train; 0 = until stopped")
    p.add_argument("--microbatch-samples", type=positive_int, default=4)
    p.add_argument("--seq-len", type=positive_int, default=64)
    p.add_argument("--microbatches", type=positive_int, default=4, help="microbatches per stage-0 peer per iteration")
    p.add_argument("--global-batch", type=non_negative_int, default=0, metavar="N",
                   help="microbatches per iteration in all, split among the stage-0 peers by their speed, the "
                        "same whoever joins or leaves (default: 0 = --microbatches on each stage-0 peer)")
    p.add_argument("--gradient-exchange", choices=GRADIENT_EXCHANGES, default=DEFAULT_GRADIENT_EXCHANGE,
                   help="when the replicas' averaged gradients are applied: sync (at the end of their own "
                        "iteration) or delayed (one iteration later: the exchange overlaps the next iteration's "
                        "work; docs/architecture.md) (default: %(default)s)")
    p.add_argument("--lr", type=learning_rate, default=3e-3, help="peak AdamW learning rate")
    p.add_argument("--checkpoint-dir", default="", metavar="DIR",
                   help="the peers' per-stage checkpoints, where this machine sees them: a run started again "
                        "with the same folder resumes (a coordinator with no schedule left in the DHT continues "
                        "the sample cursor of the newest stage-0 checkpoint)")
    status_port = own["status_port"]
    p.add_argument("--status-port", type=port_or_off, default=status_port, metavar="PORT|off",
                   help="HTTP status page, /api/status and /metrics (0: any free port; "
                        f"default: {status_port if status_port is not None else 'off'})")
    p.add_argument("--join-key", default="", metavar="FILE",
                   help="admit only peers holding this secret file (created, mode 0600, if missing)")
    # off until compressed runs train within issue 27's loss targets (int8 +1.6%, int4 +5.8%
    # measured): an organiser opts in with auto; peers follow whatever the schedule says
    add_wire_compression(p, default="off")


def add_wire_compression(p, default: str = "auto") -> None:
    """--wire-compression, the same for skippipe-coordinator run, skippipe-swarm and skippipe-peer
    (`p`: a parser or an argument group). The coordinator's choice goes into the schedule (per
    link); a peer's: auto follows the schedule, off never compresses, int8/int4 always."""
    p.add_argument("--wire-compression", choices=WIRE_COMPRESSION, default=default, help=WIRE_COMPRESSION_HELP)


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="", metavar="DIR",
                   help="dataset folder to train on (from `skippipe-coordinator data`; peers without a copy "
                        "download it from the coordinator); default: the embedded corpus")
    p.add_argument("--tokenizer", default="", metavar="byte|bpe|FILE",
                   help="tokenizer of the embedded corpus (default: byte; bpe: the shipped 4096-token BPE); "
                        "with --data, the dataset's own (checked)")
