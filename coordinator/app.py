"""Composition root of the coordinator: DHT, run spec, swarm watching, planning, publishing,
progress. One loop; every step bounded; Ctrl-C stops it cleanly."""
import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Awaitable, Callable

from hivemind import DHT
from opsweb.dht_process import safe_for_large_calls
from opsweb.lifecycle import Lifecycle

from opsweb.server import StatusServer
from opsweb.stopping import shutdown_dht

from protocol.messages import RunSpec
from protocol.schedule import Schedule
from swarmcore.dht.validators import record_validators
from swarmcore.relay import relay_kwargs

from tokendata.transfer import DataServer

from coordinator.config import CoordinatorConfig
from coordinator.data_ledger import DataLedger
from coordinator.data_resume import saved_cursor
from coordinator.data_setup import RunData, resolve_run_data, servable_files
from coordinator.dht_io import CoordinatorRecords
from coordinator.members import admission_for
from coordinator.organiser_key import run_address
from coordinator.planner import PlanConfig, PlanningError, plan
from coordinator.published import PublishedSchedules
from coordinator.iteration_summaries import IterationSummary, ProgressTracker
from coordinator.run_files import (load_or_create_join_key, load_organiser, remove_stale_maddrs_file,
                                   write_maddrs_file)
from coordinator.replanner import (CollapseGuard, PresenceTracker, ReplanPolicy, pulled_in_start, republish_start,
                                   switch_from_progress)
from coordinator.slow_peers import SlowPeers, late_reports
from coordinator.witnessed_speed import WitnessedSpeed
from coordinator.status_page import StatusView
from coordinator.advert_check import AdvertGate
from coordinator.swarm_view import BanList, NotPlannable, SwarmSnapshot, to_topology

logger = logging.getLogger("skippipe.coordinator")
DHT_SHUTDOWN_S = 1.5      # then hivemind terminates its DHT child: inside the 5 s a stop may take
# the spec and the newest schedule are written again this often: a read visits only the nodes
# nearest a key now (swarmcore/dht/records.py DHT_BEAM), which change as peers join and leave
RESTORE_CONTROL_S = 20.0
STORED_SCHEDULE_TRIES = 3          # a restarted coordinator's reads of the stored schedule
STORED_SCHEDULE_RETRY_S = 2.0


def spec_from_config(config: CoordinatorConfig, data: RunData | None = None) -> RunSpec:
    data = data or resolve_run_data(config.data_dir, config.tokenizer)
    return RunSpec(tokenizer=data.tokenizer, tokenizer_hash=data.tokenizer_hash, dataset_id=data.dataset_id,
                   vocab_size=data.vocab_size, run=config.run, model=config.model, model_config=config.model_config,
                   num_stages=config.num_stages,
                   skip_ratio=config.skip_ratio, seed=config.seed,
                   microbatch_samples=config.microbatch_samples, seq_len=config.seq_len,
                   microbatches_per_origin=config.microbatches_per_origin, global_batch=config.global_batch,
                   gradient_exchange=config.gradient_exchange,
                   learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
                   max_steps=config.max_steps)


class CoordinatorApp:
    # skippipe-swarm --topology swaps in the emulated links (the peers' probes may come too late)
    adjust_topology = staticmethod(lambda topology: topology)

    def __init__(self, config: CoordinatorConfig,
                 on_iteration: Callable[[IterationSummary], Awaitable[None] | None] | None = None,
                 run_data: RunData | None = None, stop: asyncio.Event | None = None):
        self.config = config
        self.run_data = run_data or resolve_run_data(config.data_dir, config.tokenizer)
        self.spec = spec_from_config(config, self.run_data)
        self.on_iteration = on_iteration
        self.stop = stop or asyncio.Event()
        # the DHT round loop (and anything it starts) until the run is over or a stop
        self.life = Lifecycle("the coordinator", logger, stop=self.stop)
        self.ready = asyncio.Event()        # set once the DHT is up and the spec is written
        self.dht = None                      # a hivemind DHT once run() starts it
        self.schedule: Schedule | None = None
        self.progress = ProgressTracker()
        self.published = PublishedSchedules(lambda i: self.progress.reports.get(i, {}))
        self.resync: list[str] = []         # why the current epoch must be published again
        self.summaries: list[IterationSummary] = []
        self.presence = PresenceTracker(ReplanPolicy(min_peers=max(1, config.min_peers),
                                                         hold_s=config.replan_hold_s))
        self.ended = asyncio.Event()        # the last iteration is summarised: the peers may go while run() closes the DHT
        self._adopted_at = 0.0           # monotonic time self.schedule was adopted
        self.replans: list[dict] = []       # every published epoch: when, why, from which iteration
        self.bans = BanList(routes=self.published.route_of, replicas=self.published.replicas_of)   # failed spot/share checks
        self.advert_gate = AdvertGate(self.spec)   # adverts the spec rules out: ignored, logged once
        self.snapshot: SwarmSnapshot | None = None      # the latest round's view (status page)
        self.collapse_guard = CollapseGuard()
        self.slow_peers = SlowPeers()   # demoted by measured speed (slow_peers.py)
        self.witness = WitnessedSpeed()  # ... as the origins' round trips show it
        self.topology = None                # what the current schedule was planned for (Gantt)
        self.last_reports: dict = {}        # peer -> IterationReport of the last completed iteration
        self.status = StatusView(self)
        self.http: StatusServer | None = None
        self.ledger = DataLedger(self.spec.microbatch_samples)   # lost samples go to the next epoch
        self.member_book = None             # coordinator.members.MemberBook of a private run
        self.resumed = None                 # coordinator.data_resume.SavedCursor of a checkpointed run

    @property
    def maddrs(self) -> list[str]:
        return [str(a) for a in self.dht.get_visible_maddrs()]

    async def run(self) -> int:
        cfg = self.config
        join_key = load_or_create_join_key(cfg.join_key_path) if cfg.join_key_path else None
        if cfg.maddrs_file:   # one left by a run that crashed names a dead peer id: gone until we are up
            remove_stale_maddrs_file(cfg.maddrs_file)
        # in a thread: the loop keeps answering Ctrl-C while the DHT comes up
        organiser = load_organiser(cfg.organiser_key_path)
        admission, self.member_book = admission_for(cfg.run, join_key, cfg.members_path, organiser)
        signer, validators = record_validators(cfg.run, join_key=join_key, admission=admission)
        self.dht = await asyncio.to_thread(lambda: safe_for_large_calls(DHT(
            start=True, initial_peers=list(cfg.initial_peers) or None, host_maddrs=list(cfg.host_maddrs),
            announce_maddrs=list(cfg.announce_maddrs) or None, record_validators=validators,
            shutdown_timeout=DHT_SHUTDOWN_S, **relay_kwargs(serve_relay=cfg.serve_relay))))
        self.records = CoordinatorRecords(self.dht, cfg.run, join_key, organiser, signer.local_public_key, admission)
        try:
            # a stop cancels the round in hand: one waiting on a DHT whose p2pd a Ctrl-C
            # already ended would otherwise hold the stop up
            await self.life.run(self._serve())
            return 0
        finally:
            if self.http is not None:
                await self.http.close()
            if cfg.maddrs_file:  # a stale file would send peers to a dead address
                Path(cfg.maddrs_file).unlink(missing_ok=True)
            # joins the DHT child for up to its shutdown_timeout: off the loop, which keeps
            # answering signals (a second Ctrl-C) meanwhile
            await asyncio.to_thread(shutdown_dht, self.dht)

    @property
    def finished(self) -> bool:
        """The run's last iteration (--steps) is summarised."""
        return self.ended.is_set()

    def shutdown(self) -> None:
        """Ends run(): the round in hand is cancelled, then the status page, the maddrs file
        and the DHT go."""
        self.life.shutdown()

    @property
    def run_address(self) -> str:
        """What peers pass to --run: the name and the organiser key they pin."""
        return run_address(self.config.run, self.records.organiser)

    async def _serve(self) -> None:
        cfg = self.config
        await self.records.put_spec(self.spec)
        await self._serve_data()
        stored = await self._stored_schedule(tries=STORED_SCHEDULE_TRIES if cfg.initial_peers else 1)
        if stored is not None:
            await self._adopt_stored(stored)
            logger.info("continuing from stored schedule epoch %d", stored.epoch)
        elif cfg.checkpoint_dir:
            self.resumed = saved_cursor(cfg.checkpoint_dir, cfg.run, self.spec.dataset_id)
            if self.resumed is not None:
                self.ledger.resumed = (self.resumed.base, self.resumed.retry)
        logger.info("run %r is up. Peers join with:\n  skippipe-peer --run %s --initial-peers %s",
                    cfg.run, self.run_address, " ".join(self.maddrs))
        await self._start_status_page()
        if cfg.maddrs_file:
            write_maddrs_file(cfg.maddrs_file, self.maddrs)
        self.ready.set()
        await self._loop()

    async def _stored_schedule(self, tries: int = 1) -> Schedule | None:
        """The run's schedule in the DHT, if any. A coordinator restarted into a live swarm tries a
        few times: its first lookups can miss while its routing table fills, and planning from
        scratch would leave the peers' epoch unknown and their iterations unsummarised."""
        for attempt in range(tries):
            stored = await self.records.get_schedule()
            if stored is not None and stored.run == self.config.run:
                return stored
            if attempt + 1 < tries:
                await asyncio.sleep(STORED_SCHEDULE_RETRY_S)
        return None

    async def _adopt_stored(self, stored: Schedule) -> None:
        """A restart takes the stored schedule and the one before it: the stored one may start
        ahead of the swarm (published just before the restart), and without the one the swarm
        still runs its iterations could not be accounted until then (bench/faults.py: 8-19
        iterations unsummarised around a restart)."""
        before = await self.records.get_schedule(previous=True)
        if before is not None and before.run == self.config.run and before.epoch < stored.epoch and \
                (self.schedule is None or before.epoch > self.schedule.epoch):
            self._adopt(before)
        self._adopt(stored)

    async def _follow_newer_epoch(self) -> None:
        """Peers report an epoch newer than any we know (our first read of the schedule missed,
        or it raced a publication): take the stored one."""
        newest = self.progress.newest_epoch()
        if newest is None or (self.schedule is not None and newest <= self.schedule.epoch):
            return
        stored = await self._stored_schedule()
        if stored is not None and (self.schedule is None or stored.epoch > self.schedule.epoch):
            await self._adopt_stored(stored)
            logger.info("peers run epoch %d: following the stored schedule", stored.epoch)

    async def _serve_data(self) -> None:
        """Volunteers without a copy of --data download it from us (tokendata/transfer.py)."""
        files = servable_files(self.run_data)
        if files:
            self.data_server = DataServer(self.run_data.dataset_id, files)
            await self.data_server.attach(await self.dht.replicate_p2p())
            logger.info("serving dataset %s (%d files) to peers", self.run_data.dataset_id, len(files))

    async def _start_status_page(self) -> None:
        if self.config.status_port is None:
            return
        http = StatusServer(self.status.routes(), self.config.status_host, self.config.status_port)
        try:
            await http.start()
        except OSError as exc:  # the run goes on without a page: it is for people, not peers
            logger.warning("no status page: cannot listen on %s:%d (%s); pass another --status-port "
                           "(0: any free port, off: none)", self.config.status_host, self.config.status_port,
                           exc.strerror)
            return
        self.http = http
        logger.info("status page at %s (metrics at %smetrics)", http.url, http.url)

    async def _loop(self) -> None:
        last_restore = time.monotonic()
        while not self.stop.is_set() and not self.finished:
            try:
                await self._tick()
            except Exception as exc:  # one bad round (DHT hiccup) must not end the run
                logger.warning("coordinator round failed: %s", exc)
            if time.monotonic() - last_restore > RESTORE_CONTROL_S:
                await self.records.put_spec(self.spec)
                if self.schedule is not None:
                    await self.records.put_schedule_record(self.schedule)
                last_restore = time.monotonic()
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=self.config.poll_interval_s)
            except TimeoutError:
                pass

    async def _tick(self) -> None:
        read_from = time.monotonic()
        adverts = await self.records.get_adverts()
        if self.member_book is not None:      # private run: invitations bound, bans applied, roster out
            adverts = await self.member_book.round(self.records, adverts)
        adverts = self.advert_gate.admit(await self._unbanned(adverts))
        read_s = time.monotonic() - read_from
        snapshot = SwarmSnapshot(adverts, await self.records.get_links())
        now = time.monotonic()
        if self.snapshot is not None and not self.collapse_guard.accept(
                frozenset(self.snapshot.online), frozenset(snapshot.online), now, read_s):
            logger.info("the DHT shows %d of %d peers (read in %.1fs): taking it for a failed lookup for now",
                        len(snapshot.online), len(self.snapshot.online), read_s)
            snapshot = self.snapshot
        self.snapshot = snapshot
        self.status.observe(snapshot)
        self.presence.observe(frozenset(snapshot.online), now)
        self.slow_peers.observe({p: a.measured_fwd_s_per_layer_sample for p, a in snapshot.online.items()}, now,
                                self.witness.times(),
                                late_reports(snapshot.online, self.published.all[-1] if self.published.all else None))
        # progress first: a restarted coordinator that missed the stored schedule must follow the
        # epoch the peers run before it plans (a plan from scratch would be an epoch they refuse)
        self.progress.add(await self.records.get_progress())
        await self._follow_newer_epoch()
        if self.presence.should_plan(now) or (self.slow_peers.pending() and self.presence.gap_passed(now)):
            await self._replan(snapshot)
            self.presence.planned_now(now)
        await self._account_iterations(frozenset(snapshot.online), now)
        if (self.resync or self.ledger.has_pending()) and self.schedule is not None and not self.finished:
            await self._republish("; ".join(self.resync) or "lost samples to train again")
        elif self.schedule is not None and not self.finished:
            await self._pull_in_far_start()

    async def _account_iterations(self, online: frozenset[str], now: float) -> None:
        """Summarise the iterations every expected origin reported (or left without reporting)."""
        pending = {i: dict(r) for i, r in self.progress.reports.items()}  # complete() drops them
        published = self.published
        # an origin's microbatches are lost once it stays gone: one read that missed its advert
        # (a store late under load, a lookup that came back short) is not a death
        def gone(peer: str) -> bool:
            return peer not in online and self.presence.absent_for(peer, now) >= self.config.lost_after_s
        for summary in self.progress.complete(published.origins_for, gone,
                                              published.planned_microbatches, published.planned_ids,
                                              published.known_from()):
            self.summaries.append(summary)
            reports = self.last_reports = pending.get(summary.iteration, {})
            self.resync += published.judge(summary.iteration, reports)
            self.witness.add(published.ran_under(summary.iteration, reports), reports)
            if summary.lost_microbatches:
                positions = self.ledger.lost(published.ran_under(summary.iteration, reports),
                                             summary.iteration, summary.lost_microbatches)
                logger.info("iteration %d lost microbatch(es) %s: their %d samples are trained again later",
                            summary.iteration, list(summary.lost_microbatches), len(positions))
            if self.on_iteration is not None:
                result = self.on_iteration(summary)
                if asyncio.iscoroutine(result):
                    await result
            if self.spec.max_steps and summary.iteration + 1 >= self.spec.max_steps:
                self.ended.set()

    async def _unbanned(self, adverts: dict) -> dict:
        for reporter, record in (await self.records.get_spot_checks()).items():
            if reporter in adverts:  # only members' reports count
                for peer in self.bans.observe(reporter, record.reports):
                    logger.warning("banned %s from run %r: %s", peer, self.config.run, self.bans.banned[peer])
        return {p: a for p, a in adverts.items() if p not in self.bans.banned}

    async def _replan(self, snapshot: SwarmSnapshot) -> None:
        pinned = self.schedule.stage_of() if self.schedule else {}
        # never an epoch the peers already passed (they refuse older ones)
        epoch = max(self.schedule.epoch if self.schedule else 0, self.progress.newest_epoch() or 0) + 1
        try:
            topology = to_topology(snapshot, self.spec, {p: s for p, s in pinned.items() if p in snapshot.online})
            topology = self.slow_peers.apply(self.adjust_topology(topology))
            t0 = time.perf_counter()
            config = PlanConfig(strategy=self.config.strategy, skip_ratio=self.spec.skip_ratio,
                                run=self.spec.run, epoch=epoch, overheads=self.config.overheads,
                                wire_compression=self.config.wire_compression)
            # seconds of CPU for a dozen peers: off the event loop, which keeps serving the
            # DHT, progress reports and the status page meanwhile
            schedule = await asyncio.to_thread(plan, topology, config, self.config.seed + epoch)
        except (NotPlannable, PlanningError) as exc:
            logger.warning("cannot plan yet: %s", exc)
            return
        start = self._next_start_iteration()
        schedule = dataclasses.replace(schedule, start_iteration=start, **self.published.data_fields(self.ledger, start))
        await self.records.put_schedule(schedule, previous=self._running_schedule(), superseded=self.schedule)
        self._adopt(schedule)
        self.topology = topology
        self.replans.append({"epoch": epoch, "published_at": time.time(), "start_iteration": schedule.start_iteration,
                             "peers": len(topology.nodes), "predicted_iteration_s": schedule.predicted_iteration_s,
                             "slow_peers": {p: round(r, 2) for p, r in self.slow_peers.factors.items()},
                             "membership_changed_at": time.time() - (time.monotonic() - self.presence.changed_at)})
        stages = {}
        for peer, stage in schedule.stage_of().items():
            stages.setdefault(stage, []).append(peer[:8])
        logger.info("published epoch %d from iteration %d: %d peers, %d routes, predicted %.2fs/iteration "
                    "(planned in %.2fs); stages %s; slow peers (measured): %s", epoch, schedule.start_iteration,
                    len(topology.nodes), len(schedule.routes), schedule.predicted_iteration_s,
                    time.perf_counter() - t0, {s: len(p) for s, p in sorted(stages.items())},
                    self.slow_peers.describe())

    async def _pull_in_far_start(self) -> None:
        """The newest epoch, published to start far ahead of a swarm that crawls, again from
        nearer (replanner.pulled_in_start)."""
        latest = max(self.progress.latest_reported(), self.summaries[-1].iteration if self.summaries else -1)
        if latest < 0 or self.schedule.start_iteration <= latest + 2:
            return      # running already, or about to: the usual case costs no start estimate
        start = pulled_in_start(self.schedule.start_iteration, latest, self._next_start_iteration(),
                                time.monotonic() - self._adopted_at, self.config.switch_margin_s)
        if start is not None:
            await self._republish(f"epoch {self.schedule.epoch} starts at iteration {self.schedule.start_iteration}, "
                                  f"far ahead of the swarm at {latest}", start)

    async def _republish(self, why: str, start: int | None = None) -> None:
        """The current routes as a new epoch: only its data fields change. `start`: from there
        (sooner than the current epoch's own start: _pull_in_far_start), else replanner.republish_start."""
        if start is None:
            start = republish_start(self._next_start_iteration(), self.schedule.start_iteration)
        if self.published.awaits_uptake(start):
            return   # its data fields go on from an epoch the origins may yet miss: next round
        self.resync = []
        schedule = dataclasses.replace(self.schedule, epoch=self.schedule.epoch + 1, start_iteration=start,
                                       **self.published.data_fields(self.ledger, start))
        await self.records.put_schedule(schedule, previous=self._running_schedule(), superseded=self.schedule)
        self._adopt(schedule)
        self.replans.append({"epoch": schedule.epoch, "published_at": time.time(), "start_iteration": start,
                             "peers": len(schedule.assignment), "reason": why,
                             "predicted_iteration_s": schedule.predicted_iteration_s})
        logger.info("published epoch %d from iteration %d (same routes): %s (%d samples)", schedule.epoch,
                    start, why, len(schedule.data_retry))

    def _next_start_iteration(self) -> int:
        if self.schedule is None and not self.progress.reports and not self.summaries:
            return self.resumed.iteration if self.resumed else 0
        latest = max(self.progress.latest_reported(), self.summaries[-1].iteration if self.summaries else -1)
        since = time.time() - self.summaries[-1].finished_at if self.summaries else 0.0
        return switch_from_progress(latest, [s.duration_s for s in self.summaries[-5:]], since,
                                    self.config.switch_margin_s * self.published.uptake.margin_factor(),
                                    self.progress.freshest(), time.time(), self.progress.running_s())

    def _running_schedule(self) -> Schedule | None:
        """The schedule the swarm runs now (its newest summarised iteration's), stored beside a
        new one for a restarted coordinator: not merely the one before it, which may not have
        started either (two re-plans a few seconds apart, both ahead of the swarm: 9 iterations
        went unsummarised around a restart in bench/faults.py)."""
        if self.summaries:
            return self.published.ran_under(self.summaries[-1].iteration, self.last_reports) or self.schedule
        return self.schedule

    def _adopt(self, schedule: Schedule) -> None:
        self.schedule, self._adopted_at = schedule, time.monotonic()
        self.published.add(schedule)
        self.ledger.carried_by(schedule)
