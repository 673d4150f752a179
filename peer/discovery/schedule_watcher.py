"""The schedule, read from the DHT into the peer's ScheduleBook: every poll period, and at once
when the worker or a handler asks (a message names an epoch we lack)."""
import asyncio
import logging

from peer.discovery.announcer import Announcer
from peer.pipeline.schedule_book import ScheduleBook, StaleSchedule

logger = logging.getLogger("skippipe.peer")


class ScheduleWatcher:
    def __init__(self, records, book: ScheduleBook, run: str, announcer: Announcer, poll_s: float):
        self.records, self.book, self.run_name = records, book, run
        self.announcer, self.poll_s = announcer, poll_s

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.poll_s)

    async def refresh(self) -> None:
        try:
            schedule = await self.records.get_schedule()
        except Exception as exc:
            logger.warning("reading the schedule failed: %s", exc)
            return
        if schedule is None or schedule.run != self.run_name:
            return
        known = self.book.latest.epoch if self.book.latest is not None else None
        try:
            if self.book.add(schedule):
                logger.info("schedule epoch %d (from iteration %d, %s, %d routes)", schedule.epoch,
                            schedule.start_iteration, schedule.strategy, len(schedule.routes))
                stage = schedule.stage_of().get(self.announcer.advert.peer_id)
                if stage is not None and stage != self.announcer.advert.stage:
                    self.announcer.update(stage=stage)   # the status page shows where we serve
                if known is not None and schedule.epoch > known + 1:
                    await self._read_skipped_epochs(known, schedule.epoch)
        except StaleSchedule as exc:
            logger.warning("ignoring schedule: %s", exc)

    async def _read_skipped_epochs(self, known: int, newest: int) -> None:
        """Epochs published while we could not read them (stopped, cut off): the origins may run
        one of them now, and without it we refuse their work until the newest starts (bench/
        faults.py: a peer paused through a pulled-in epoch cost the swarm 47 s)."""
        try:
            earlier = await self.records.get_earlier_schedules()
        except Exception as exc:
            logger.warning("reading the epochs we skipped failed: %s", exc)
            return
        for schedule in earlier:
            if schedule.run == self.run_name and known < schedule.epoch < newest and self.book.add_skipped(schedule):
                logger.info("schedule epoch %d (from iteration %d): one we skipped, read from the coordinator's "
                            "earlier records", schedule.epoch, schedule.start_iteration)
