"""What a peer needs from torch for one run: device facts, the layer benchmark, stage runners
and its data. Built once the run spec is known (and after the DHT has forked)."""
import logging

import torch

from protocol.adverts import PeerAdvert, PeerState
from protocol.messages import RunSpec

from peer import hardware
from peer.compute import device as devices
from peer.compute import precision
from peer.compute.host_buffers import DeviceIO
from peer.compute.model import count_parameters, spec_config
from peer.compute.runner import StageRunner
from peer.compute.stages import layer_ranges
from peer.config import PeerConfig
from peer.pipeline.share_codec import SHARE_BYTES
from peer.progress import Progress

logger = logging.getLogger("skippipe.peer")
BYTES_PER_FLOAT = 4


def set_torch_threads(threads: int) -> None:
    """torch's intra-op threads, for the calling thread and every thread that first computes
    after this. Call it on the event loop's thread: torch fixes a thread's count the first time
    that thread computes, and a peer forked from the launcher's fork server inherits its main
    thread's count from the server (the machine's cores), which with several peers on a few
    cores cost a third of a local swarm's throughput in spinning threads."""
    torch.set_num_threads(threads)


class RuntimeFactory:
    def __init__(self, spec: RunSpec, config: PeerConfig, slowdown: float = 1.0):
        set_torch_threads(config.torch_threads)   # the compute thread's, when built off the loop
        self.spec, self.config = spec, config
        self.model = spec_config(spec)
        self.device = hardware.probe_device(config.device)
        self.precision = precision.resolve(config.device, config.wire_dtype)
        self.reserved_bytes = self._reserve()
        if config.benchmark:
            bench = hardware.benchmark_layer(self.model, config.device, samples=spec.microbatch_samples,
                                             seq_len=min(spec.seq_len, self.model.max_seq_len),
                                             cache_dir=config.cache_dir, autocast=self.precision.autocast)
            self.fwd_s_per_layer_sample = bench.fwd_s_per_layer_sample
            logger.info("one layer forward: %.2f ms per sample on %s%s", 1000 * bench.fwd_s_per_layer_sample,
                        self.device.name, " (cached)" if bench.cached else "")
        else:
            self.fwd_s_per_layer_sample = 0.01
        # an emulated slow device (--topology) computes `slowdown` times slower: advertise that
        self.fwd_s_per_layer_sample *= slowdown
        self.samples = None     # peer.samples.SampleSource, set before training as stage 0

    def _reserve(self) -> int:
        """Hold the largest stage's memory now (GPU only), so a long run cannot OOM later."""
        spec, dev = self.spec, torch.device(self.config.device)
        ranges = layer_ranges(self.model.n_layers, spec.num_stages, spec.stage_sizes)
        budget = max(devices.stage_budget(self.model, end - start, s == 0, spec.microbatch_samples,
                                          spec.seq_len, self.config.max_activations,
                                          self.precision.autocast is not None)
                     for s, (start, end) in enumerate(ranges))
        try:
            reserved = devices.reserve(dev, budget, self.config.max_vram_bytes)
        except devices.DeviceError as exc:
            from peer.startup_errors import StartupError  # one line and exit 1, not a traceback
            raise StartupError(str(exc)) from None
        if reserved:
            logger.info("reserved %s on %s; %s", devices.gib(reserved), dev, self.precision.describe())
        return reserved

    def advert(self, peer_id: str, maddrs: tuple[str, ...]) -> PeerAdvert:
        m, spec = self.model, self.spec
        params_per_layer = count_parameters(m, layers=1, with_embed_head=False)   # what a share carries
        share_bytes = SHARE_BYTES[self.config.share_dtype]
        stage0_extra = count_parameters(m, layers=0, with_embed_head=True)        # embedding, norm, head
        start, end = (0, 0)
        if self.config.stage >= 0:
            start, end = layer_ranges(m.n_layers, spec.num_stages, spec.stage_sizes)[self.config.stage]
        return PeerAdvert(
            peer_id=peer_id, state=PeerState.JOINING, device=f"{self.device.device} ({self.device.name})",
            memory_free_bytes=self.device.free_memory_bytes, fwd_s_per_layer_sample=self.fwd_s_per_layer_sample,
            stage=self.config.stage, layer_start=start, layer_end=end,
            memory_microbatches=self.config.max_activations, maddrs=maddrs, public_name=self.config.public_name,
            num_layers=m.n_layers, activation_bytes_per_sample=spec.seq_len * m.dim * BYTES_PER_FLOAT,
            param_bytes_per_layer=round(params_per_layer * share_bytes),
            stage0_extra_param_bytes=round(stage0_extra * share_bytes))

    def make_runner(self, stage: int) -> StageRunner:
        if not 0 <= stage < self.spec.num_stages:
            raise ValueError(f"stage {stage} does not exist in a run with {self.spec.num_stages} stages")
        start, end = layer_ranges(self.model.n_layers, self.spec.num_stages, self.spec.stage_sizes)[stage]
        progress = Progress(f"building stage {stage}", end - start, "layers", logger)
        runner = StageRunner.from_spec(self.spec, stage, on_layer=progress.advance,
                                       max_stash=self.config.max_activations,
                                       stash_ttl_s=self.config.activation_ttl_s, device=self.config.device,
                                       autocast_dtype=self.precision.autocast,
                                       io=DeviceIO(self.config.device, self.precision))
        progress.finish()
        return runner

    def batch(self, iteration: int, local: int, shard: int, shards: int, positions: list[int]):
        """The tokens of the global sample `positions` (tokendata/cursor.py): every origin
        reads from the same data, and the schedule decides which samples are whose."""
        if self.samples is None:  # not prepared (a unit test, or stage 0 taken unexpectedly)
            from peer.training_data import corpus_samples
            self.samples = corpus_samples(self.spec, self.config.data)
        return self.samples.batch(positions)
