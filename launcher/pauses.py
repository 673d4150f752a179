"""`--chaos pause:P@iterN[:SECONDS]`: a stalled volunteer. The launcher stops local peer P's
whole process group (the peer, its DHT process and its p2pd) with SIGSTOP once the swarm reaches
iteration N, and resumes it with SIGCONT after SECONDS (default 15): its sockets stay open and
it answers nothing meanwhile, like a machine that froze or a laptop lid closed. Only the
launcher can do this (a stopped process cannot resume itself); it signals the ids it started."""
import asyncio
import logging
import os
import signal
import subprocess
from dataclasses import dataclass

logger = logging.getLogger(__name__)
DEFAULT_PAUSE_S = 15.0


@dataclass(frozen=True)
class Pause:
    peer: int
    iteration: int
    seconds: float = DEFAULT_PAUSE_S


class Pauser:
    def __init__(self, pauses: list[Pause], peers: list[subprocess.Popen]):
        self.pending = sorted(pauses, key=lambda p: p.iteration)
        self.peers = peers                  # filled by the launcher as it starts them
        self.stopped: dict[int, asyncio.TimerHandle] = {}

    def on_iteration(self, finished_iteration: int) -> None:
        """Called with each iteration the coordinator summarised: pauses due at the next start."""
        due = [p for p in self.pending if p.iteration <= finished_iteration + 1 and p.peer < len(self.peers)]
        for pause in due:
            self.pending.remove(pause)
            if pause.peer in self.stopped or self.peers[pause.peer].poll() is not None:
                continue
            self._signal(pause.peer, signal.SIGSTOP)
            print(f"chaos: peer {pause.peer} stopped (SIGSTOP) at iteration {pause.iteration} "
                  f"for {pause.seconds:g}s", flush=True)
            handle = asyncio.get_running_loop().call_later(pause.seconds, self._resume, pause.peer)
            self.stopped[pause.peer] = handle

    def _resume(self, peer: int) -> None:
        self.stopped.pop(peer, None)
        self._signal(peer, signal.SIGCONT)
        print(f"chaos: peer {peer} resumed (SIGCONT)", flush=True)

    def resume_all(self) -> None:
        """Before the launcher stops the swarm: a stopped peer could not leave cleanly."""
        for peer, handle in list(self.stopped.items()):
            handle.cancel()
            self._resume(peer)

    def _signal(self, peer: int, sig: int) -> None:
        try:
            os.killpg(self.peers[peer].pid, sig)      # its own session: the group is its pid
        except ProcessLookupError:
            logger.info("peer %d is gone; no %s", peer, signal.Signals(sig).name)
