"""The work loop: runs this peer's forward/backward tasks in the schedule's order."""
