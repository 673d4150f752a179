"""Typed configuration of one volunteer peer (filled from CLI flags by peer/cli.py)."""
from dataclasses import dataclass
from pathlib import Path

STAGE_AUTO = -1
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "skippipe"   # layer benchmarks (peer/hardware.py)


@dataclass(frozen=True)
class PeerConfig:
    initial_peers: tuple[str, ...]
    run: str = "default"
    organiser_key: str = ""                   # pinned (--run NAME@KEY); "" = trust the first key seen
    device: str = "cpu"                       # "cpu" or "cuda:N"
    max_vram_bytes: int = 0                   # --max-vram: cap on GPU memory; 0 = the whole GPU
    wire_dtype: str = "auto"                  # activations on the wire; auto = compute dtype (bf16 on CUDA)
    share_dtype: str = "int8"                 # replicas' gradient shares on the wire (protocol SHARE_DTYPES)
    wire_compression: str = "auto"            # activations/gradients between hops (peer/pipeline/wire.py)
    stage: int = STAGE_AUTO                   # STAGE_AUTO: the coordinator assigns one
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    relay_via: tuple[str, ...] = ()           # behind NAT: reserve a slot on these relays (swarmcore/relay.py)
    serve_relay: bool = False                 # public: relay for peers behind NAT
    data: Path | None = None                  # None: the embedded corpus
    cache_dir: Path = DEFAULT_CACHE_DIR
    checkpoint_dir: Path | None = None
    save_every: int = 1                       # checkpoint after every N-th iteration (and the last)
    keep_last: int = 2                        # checkpoint versions kept per stage
    announce_period_s: float = 1.5            # adverts expire after 2 x this: death seen in ~3 s
    max_activations: int = 8                  # microbatches held for backward at once
    activation_ttl_s: float = 120.0
    rpc_timeout_s: float = 30.0
    iteration_timeout_s: float = 120.0
    status_interval_s: float = 10.0
    linger_s: float = 5.0                     # after the last iteration: stay, re-publish the last report
    link_probe_period_s: float = 30.0         # link RTT/bandwidth probes to every peer; 0: off
    torch_threads: int = 1
    public_name: str = ""
    benchmark: bool = True                    # measure one layer at start (cached)
    identity_path: Path | None = None         # persistent key file (peer id); None: a fresh one per start
    join_key_path: Path | None = None         # the run's join secret, when it requires one
    invite: str = ""                          # an invitation token (protocol/invitations.py), when admitted by one
    max_requests_per_s: float = 100.0         # per remote peer (token bucket; burst = 2 s worth)
    fault: str = ""                           # chaos testing: see peer/chaos.py
    spot_check_rate: float = 0.0              # share of our forwards recomputed on another replica (0: off)
    metrics_port: int | None = None           # /metrics and /api/status; None: off, 0: any free port
    metrics_host: str = "127.0.0.1"           # 0.0.0.0 to let a Prometheus elsewhere scrape it
    max_request_mb: int = 256                 # largest streamed tensor, and what one peer's half-received streams hold (all: 4x)
    topology: Path | None = None              # emulate this topology file's links (peer/emulated_node.py)
    node_id: str = ""                         # which node of --topology this peer is
    node_map: Path | None = None              # peer id -> node id of the other peers

    @property
    def dht_poll_s(self) -> float:
        """How often we read the schedule and the adverts from the DHT: half an announce
        period, at least 1 s. Each read validates every record's signature, which is most of
        the DHT's CPU: polling much faster than adverts change only loads a busy machine."""
        return max(1.0, self.announce_period_s / 2)
