"""Composition root of `skippipe-peer`: DHT, transport, discovery, the pipeline worker."""
import asyncio
import collections
import functools
import logging
import time

from hivemind import DHT

from opsweb.dht_process import safe_for_large_calls
from opsweb.lifecycle import Lifecycle
from opsweb.server import StatusServer
from opsweb.stopping import run_until_stopped, shutdown_dht

from protocol.adverts import MAX_LATE_PEERS, LinkReport, PeerState
from protocol.errors import ProtocolError
from protocol.messages import IterationReport, MicrobatchCounts, ProgressRecord, RunSpec

from peer.config import PeerConfig
from peer.startup_errors import StartupError   # raised here; importers of peer.app still find it
from peer.emulated_node import EmulationError, emulate
from peer.security.guard import PeerGuard
from peer.security.limits import coalesced
from peer.discovery import known_peers
from peer.discovery.announcer import Announcer
from peer.discovery.link_prober import measure_link
from peer.discovery.rebootstrap import peer_ids_of, rebootstrap
from peer.discovery.publisher import LatestPublisher
from peer.discovery.schedule_watcher import ScheduleWatcher
from peer.pipeline.checkpoint import CheckpointStore
from peer.pipeline.handlers import WorkHandlers
from peer.pipeline.schedule_book import ScheduleBook
from peer.chaos import claimed_speed, corrupting, make_hook, parse_faults
from peer.pipeline.rejoin import Isolation
from peer.pipeline.seat import StageSeat
from peer.pipeline.worker import IterationOutcome, PipelineWorker, WorkerHooks, WorkerSettings
from peer.routing.health import Health
from peer.metrics import MeteredTransport, PeerMetrics, metrics_routes
from peer.isolation import IsolationMonitor
from peer.reachability import run_self_test
from swarmcore.relay import relay_kwargs, visible_maddrs, watch_circuits
from peer.relay_slots import slots_changed, wait_for_slot
from peer.status import status_line
from peer.transport.hivemind_p2p import HivemindTransport
from peer.transport.redial import Redialer
from peer.transport.rpc import RpcClient, RpcServer

from tokendata.cursor import compress_positions

logger = logging.getLogger("skippipe.peer")
SPEC_WAIT_S = 60.0
REPUBLISH_WHILE_LINGERING_S = 2.0   # a put lost to a DHT in flux (peers leaving) is tried again
REPORTS_KEPT = 64   # the coordinator reads progress about once a second: enough for fast tiny swarms
SPOT_CHECKS_TTL_S = 1800.0   # our spot-check reports stay readable this long after the last one
SPEC_HINT_AFTER_S = 5.0      # a wrong --run shows as this one log line, not a silent minute
PROGRESS_HEARTBEAT_S = 2.0   # origins re-store their progress record at least this often
SPEED_ADVERT_PERIOD_S = 5.0  # measured speed into the advert (and an idle peer's probe) this often
JOIN_ATTEMPTS = 3            # joining through --initial-peers, with JOIN_RETRY_S x attempt between
JOIN_RETRY_S = 3.0
DHT_SHUTDOWN_S = 1.5         # then hivemind terminates its DHT child: inside the 5 s a stop may take


class Stopped(Exception):
    """A stop signal arrived while starting up: leave without joining."""


def start_dht(config: PeerConfig, guard: PeerGuard, attempts: int = JOIN_ATTEMPTS) -> DHT:
    """Join through --initial-peers, a few times: a peer restarted right after it died (same
    identity) was once refused by a bootstrap peer still holding the dead one's connection."""
    initial = list(config.initial_peers)
    settings = {**relay_kwargs(config.relay_via, config.serve_relay), **guard.dht_kwargs()}  # not a join failure
    for attempt in range(1, attempts + 1):
        try:
            return safe_for_large_calls(DHT(
                start=True, initial_peers=initial, host_maddrs=list(config.host_maddrs),
                announce_maddrs=list(config.announce_maddrs) or None, shutdown_timeout=DHT_SHUTDOWN_S,
                **settings))
        except Exception as exc:
            if guard.is_duplicate(exc):
                raise StartupError(guard.duplicate_message()) from None
            if attempt == attempts:
                raise StartupError(f"could not join the swarm through {', '.join(config.initial_peers)} "
                                   f"({attempts} attempts): {exc}. Is the coordinator running, and is that "
                                   f"address reachable from here?") from None
            logger.warning("joining through %s failed (attempt %d of %d), trying again in %.0fs: %s",
                           ", ".join(config.initial_peers), attempt, attempts, JOIN_RETRY_S * attempt,
                           str(exc).splitlines()[0][:200])
            time.sleep(JOIN_RETRY_S * attempt)
            remembered = [a for a in known_peers.load(config.cache_dir, config.run) if a not in initial]
            if remembered:
                logger.info("also trying %d peer(s) this peer trained with before (%s)", len(remembered),
                            known_peers.path_for(config.cache_dir, config.run))
                initial = initial + remembered


class PeerApp:
    def __init__(self, config: PeerConfig, stop: asyncio.Event | None = None):
        self.config = config
        self.stop = stop or asyncio.Event()
        # once joined: the work loop, the announcer and the watchers run in it until a stop
        self.life = Lifecycle("the peer", logger, stop=self.stop)
        self.advert_state = PeerState.JOINING
        self.run_over = False        # our last iteration is done: leaving needs no goodbye advert
        self.reports: collections.deque[IterationReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.progress_publisher = LatestPublisher(self._put_progress, "progress", self.life.spawn)
        self.metrics = PeerMetrics()       # read by /metrics; the worker is never touched
        self.reachability = None           # the start-up self-test's Reachability
        self.relay_watch = None            # with --relay-via: a loop that notices lost relay slots
        self.health = Health()             # shared by the worker and the isolation monitor
        self.isolation = Isolation()       # the monitor's verdict, which the worker acts on
        self.claim_speed = claimed_speed([])   # what the advert says we measure (--fault lie: less)

    async def run(self) -> int:
        try:
            self.guard = PeerGuard(self.config)
        except ValueError as exc:  # identity or join key unusable: the message says what to do
            raise StartupError(str(exc)) from None
        try:
            # before torch touches CUDA: the DHT forks; in a thread, so Ctrl-C is heard meanwhile
            dht = await self._unless_stopped(asyncio.to_thread(start_dht, self.config, self.guard))
            try:
                return await self._run_with(dht)
            finally:
                await asyncio.to_thread(shutdown_dht, dht)  # off the loop: a second Ctrl-C is still heard
        except Stopped:
            logger.info("stopped before joining the run")
            return 0
        finally:
            self.guard.close()

    def shutdown(self) -> None:
        """Leave the swarm: run() goes offline, closes the transport and the DHT, and returns."""
        self.stop.set()

    async def _unless_stopped(self, work):
        """Await `work`, or raise Stopped (cancelling it) once a stop is asked for: start-up
        steps (waiting for the run spec, building the model) must not hold a Ctrl-C up."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise Stopped

    async def _run_with(self, dht: DHT) -> int:
        cfg = self.config
        self.dht = dht
        p2p = await self._unless_stopped(dht.replicate_p2p())
        hivemind = HivemindTransport(p2p)
        try:  # the link emulator (testing only; off without --topology) sits under the metrics
            inner, self.emulation = emulate(hivemind, cfg.topology, cfg.node_id, cfg.node_map)
        except EmulationError as exc:
            raise StartupError(str(exc)) from None
        transport = MeteredTransport(inner, self.metrics)
        me = transport.peer_id
        self.records = self.guard.records(dht, me)
        hivemind.redial = Redialer(p2p, self.records.advertised_maddrs)   # a relayed peer that moved
        spec = await self._unless_stopped(self._wait_for_spec())
        logger.info("joined run %r (model %s, %d stages, skip %.2f) as %s", spec.run, spec.model,
                    spec.num_stages, spec.skip_ratio, me)
        from peer.runtime import RuntimeFactory, set_torch_threads  # torch and the model: after the DHT exists
        set_torch_threads(cfg.torch_threads)
        slowdown = self.emulation.slowdown if self.emulation else 1.0
        runtime = await self._unless_stopped(asyncio.to_thread(RuntimeFactory, spec, cfg, slowdown))
        if cfg.stage <= 0:    # stage 0 or auto: the coordinator may make us an origin
            from peer.dataset_fetch import prepare_samples
            from peer.training_data import DataMismatch
            try:
                runtime.samples = await self._unless_stopped(prepare_samples(spec, cfg, p2p, self._data_holders()))
            except DataMismatch as exc:
                raise StartupError(str(exc)) from None
        if cfg.relay_via:    # our advert should carry the circuit addresses others dial us by
            circuits = await self._unless_stopped(wait_for_slot(p2p, cfg.relay_via))
            maddrs = tuple(await visible_maddrs(p2p))
            self.relay_watch = functools.partial(watch_circuits, p2p, circuits,
                                                 lambda *change: slots_changed(self.announcer, *change))
        else:
            maddrs = tuple(str(a) for a in dht.get_visible_maddrs())
        self.announcer = Announcer(self.records, self.guard.sign_advert(runtime.advert(me, maddrs)),
                                   cfg.announce_period_s)
        self.book = ScheduleBook()
        self.schedules = ScheduleWatcher(self.records, self.book, cfg.run, self.announcer, cfg.dht_poll_s)
        self.rpc = RpcClient(transport)
        self.worker = self._worker(me, spec, runtime, slowdown)
        server = self.guard.rpc_server(self.records, RpcServer)
        WorkHandlers(self.worker, coalesced(self.schedules.refresh)).register(server)
        await transport.serve(server.handle)
        self.reachability = await self._unless_stopped(run_self_test(p2p, bool(cfg.announce_maddrs)))
        self.announcer.update(reachability=self.reachability.verdict)   # shown on the status page
        http = None
        self.announcer.update(state=PeerState.ONLINE)
        self.advert_state = PeerState.ONLINE
        try:
            http = await self._start_metrics()
            await self.life.run(self._serve())
        finally:
            if not self.run_over:   # (once the run is over nobody plans: peers leaving together
                await self.announcer.go_offline()   # cannot store for each other, each waited 3 s)
            await transport.close()
            self.worker.shutdown()   # what RPC handlers started after the work loop had ended
            if http is not None:
                await http.close()
        return 0

    def _worker(self, me: str, spec: RunSpec, runtime, slowdown: float) -> PipelineWorker:
        """The pipeline worker and its seat, every hook passed in at construction."""
        cfg = self.config
        checkpoints = CheckpointStore(cfg.checkpoint_dir, spec.run, cfg.save_every, cfg.keep_last,
                                      (spec.tokenizer, spec.tokenizer_hash)) if cfg.checkpoint_dir else None
        faults = parse_faults(cfg.fault) if cfg.fault else []
        if faults:
            logger.warning("FAULT INJECTION ON: %s", cfg.fault)
        self.claim_speed = claimed_speed(faults)
        # slowdown: an emulated slower device, compute takes x slowdown
        seat = StageSeat(corrupting(runtime.make_runner, faults), checkpoints, slowdown)
        hooks = WorkerHooks(
            batch=runtime.batch, on_iteration=self._on_iteration, refresh_schedule=self.schedules.refresh,
            publish_spot_checks=lambda record: self.records.put_spot_checks(record, ttl_s=SPOT_CHECKS_TTL_S),
            read_progress=self.records.get_progress,
            fault=make_hook(faults, seat.set_slowdown) if faults else None,
            on_late=self._advertise_late)
        settings = WorkerSettings(
            max_activations=cfg.max_activations, rpc_timeout_s=cfg.rpc_timeout_s,
            iteration_timeout_s=cfg.iteration_timeout_s, spot_check_rate=cfg.spot_check_rate,
            share_dtype=cfg.share_dtype, wire_compression=cfg.wire_compression,
            # emulated links delay every heartbeat by up to two latencies
            ping_timeout_s=1.5 + 2 * (self.emulation.max_latency_s if self.emulation else 0.0))
        return PipelineWorker(me, spec, self.rpc, self.book, seat, settings, hooks, self.health, self.isolation)

    async def _serve(self) -> None:
        """The work loop to its end, then lingering, with the background loops beside it (a
        crash in one of those is logged, the others go on); a stop cancels it all."""
        for loop in (
                self.announcer.run(), self.schedules.run(), self._probe_links(), self._print_status(),
                self._advertise_speed(), self._progress_heartbeat(),
                IsolationMonitor(self.isolation, self.health, self.worker.ledger, self.book, self.records, self.rpc,
                                 self.announcer.advert.peer_id, self.config.announce_period_s,
                                 self.config.dht_poll_s, rebootstrap=self._rebootstrap).run(),
                self.guard.run(self.config.announce_period_s),
                *([self.relay_watch()] if self.relay_watch else [])):
            self.life.spawn(loop)
        await self.worker.run()   # its crash ends the peer, as itself
        self.run_over = True
        linger = self.config.linger_s
        sent = self.worker.sender.wire.sent   # also skippipe_peer_wire_tensors_sent_total in /metrics
        logger.info("run finished after %d iterations; leaving in %.0fs (tensors sent to next hops: %d float, "
                    "%d int8, %d int4; %d of those in channel blocks)", self.worker.ledger.iteration, linger, sent["off"],
                    sent["int8"], sent["int4"], self.worker.sender.wire.sent_in_channel_blocks)
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline:
            await self.progress_publisher.flush(timeout=max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(min(REPUBLISH_WHILE_LINGERING_S, max(0.0, deadline - time.monotonic())))
            self.progress_publisher.kick()

    async def _start_metrics(self) -> StatusServer | None:
        if self.config.metrics_port is None:
            return None
        http = StatusServer(metrics_routes(self), self.config.metrics_host, self.config.metrics_port)
        try:
            await http.start()
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {self.config.metrics_host}:{self.config.metrics_port}: "
                               f"{exc.strerror}; pick another --metrics-port (0: any free port)") from None
        logger.info("metrics at %smetrics, status at %sapi/status", http.url, http.url)
        return http

    async def _wait_for_spec(self) -> RunSpec:
        start = time.monotonic()
        hinted = False
        while time.monotonic() < start + SPEC_WAIT_S:
            spec = await self.records.get_spec()
            if spec is not None:
                return spec
            if not hinted and time.monotonic() - start >= SPEC_HINT_AFTER_S:
                logger.warning("no run spec for run %r found on the DHT yet; waiting up to %.0fs more "
                               "(is --run right? it must match the coordinator's --run)",
                               self.config.run, start + SPEC_WAIT_S - time.monotonic())
                hinted = True
            await asyncio.sleep(1.0)
        raise StartupError(f"no run named {self.config.run!r} was found in the DHT within "
                           f"{SPEC_WAIT_S:.0f}s; check --run and that its coordinator is up")

    def _data_holders(self) -> list[str]:
        """Who may hold the run's dataset: the peers we joined through (the coordinator first)."""
        return peer_ids_of(self.config.initial_peers)

    async def _rebootstrap(self, peers: list[str]) -> int:
        return await rebootstrap(self.dht, [*peers, *peer_ids_of(self.config.initial_peers)])

    async def _probe_links(self) -> None:
        period_s = self.config.link_probe_period_s
        if period_s <= 0:      # off: the links are known (emulated from a topology file)
            return
        me = self.announcer.advert.peer_id
        while True:
            try:
                adverts = await self.records.get_adverts()
            except Exception as exc:
                logger.debug("listing peers failed: %s", exc)
                adverts = {}
            known_peers.save(self.config.cache_dir, self.config.run,
                             [a for adv in adverts.values() if adv.state == PeerState.ONLINE for a in adv.maddrs], me)
            links = []
            for peer in sorted(adverts):
                if peer != me and adverts[peer].state == PeerState.ONLINE:
                    link = await measure_link(self.rpc, peer)
                    if link is not None:
                        links.append(link)
            if links:
                try:
                    await self.records.put_links(LinkReport(me, tuple(links), time.time()), ttl_s=3 * period_s)
                except Exception as exc:
                    logger.debug("publishing links failed: %s", exc)
            await asyncio.sleep(period_s if links else 3.0)

    async def _progress_heartbeat(self) -> None:
        """Our progress record re-stored while no iteration ends: the coordinator then sees the
        swarm stalled where it is, and starts a re-plan's epoch near it (replanner.py)."""
        while True:
            await asyncio.sleep(PROGRESS_HEARTBEAT_S)
            if self.reports:
                self.progress_publisher.kick()

    async def _advertise_speed(self) -> None:
        """The forward speed measured while training into the advert, when it moved by a fifth
        (each change is a DHT store); probed while no work comes (peer/pipeline/speed_meter.py)."""
        seat, spec = self.worker.seat, self.worker.spec
        while True:
            await asyncio.sleep(SPEED_ADVERT_PERIOD_S)
            try:
                await seat.probe_speed(spec.microbatch_samples, spec.seq_len)
            except Exception as exc:   # a probe racing a stage change: try again next period
                logger.debug("speed probe failed: %s", exc)
            measured = self.claim_speed(self.worker.ledger.iteration, seat.speed.current())
            advertised = self.announcer.advert.measured_fwd_s_per_layer_sample
            if (measured > 0) != (advertised > 0) or abs(measured - advertised) > 0.2 * advertised:
                self.announcer.update(measured_fwd_s_per_layer_sample=measured)
            self._advertise_late(self.health.late_peers())   # marks lapse here

    def _advertise_late(self, peers: tuple[str, ...]) -> None:
        """The peers that missed our hop deadlines, for the coordinator to plan around (at once
        when one is marked; a lapsed mark leaves with the next speed advert)."""
        peers = peers[:MAX_LATE_PEERS]
        if peers != self.announcer.advert.late_peers:
            self.announcer.update(late_peers=peers)

    async def _print_status(self) -> None:
        while True:
            await asyncio.sleep(self.config.status_interval_s)
            print(status_line(self.worker, self.announcer.advert.peer_id, self.advert_state.name,
                              self.reachability.verdict if self.reachability else ""), flush=True)

    async def _on_iteration(self, outcome: IterationOutcome) -> None:
        if not self.worker.seat.runner.is_origin:
            return
        spec = self.worker.spec
        report = IterationReport(
            peer_id=self.announcer.advert.peer_id, epoch=outcome.epoch, iteration=outcome.iteration,
            loss_sum=outcome.loss_sum, samples=outcome.samples, tokens=outcome.samples * spec.seq_len,
            started_at=outcome.started_at, finished_at=outcome.finished_at,
            counts=MicrobatchCounts(**outcome.counts),
            stages_visited=outcome.stages_visited, positions=compress_positions(outcome.positions),
            lost_microbatches=tuple(outcome.lost_microbatches),
            **outcome.timed_fields())
        self.reports.append(report)
        self.progress_publisher.kick()   # in the background: the next iteration does not wait for the DHT

    def _put_progress(self):
        return self.records.put_progress(ProgressRecord(self.announcer.advert.peer_id, tuple(self.reports),
                                                        written_at=time.time()),
                                         ttl_s=600.0)



def run_peer(config: PeerConfig) -> int:
    async def main(stop: asyncio.Event) -> int:
        return await PeerApp(config, stop).run()

    try:
        return run_until_stopped(main, "the peer")
    except (StartupError, ProtocolError) as exc:
        logger.error("%s", exc)
        return 1
