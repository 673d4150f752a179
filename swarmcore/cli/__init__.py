"""Conventions of every console script: flags from files and the environment, logging
flags, one-line usage errors, the run flags the coordinator and the launcher share."""
