"""`python -m launcher`: the same as `skippipe-swarm`."""
import sys

from launcher.cli import main

sys.exit(main())
