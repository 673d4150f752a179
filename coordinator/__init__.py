"""The coordinator: swarm view, SkipPipe planner, schedule publishing. Never imports peer/."""
