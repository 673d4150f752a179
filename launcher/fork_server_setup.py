"""Imported first by the peers' fork server (launcher/fork_server.py), and by nothing else.

The server lives in the launcher's process group, so a SIGTERM to that group (`docker stop`,
`timeout`) reaches it too. Dying then would send its forked peers their parent-death SIGTERM
on top of the launcher's own, and a second SIGTERM stops a peer at once, uncleanly. So it
ignores SIGTERM and ends when the launcher does (multiprocessing closes its pipe); each
forked peer restores the default before anything else."""
import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
