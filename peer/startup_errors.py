"""The start-up failure a user must fix, in a module of its own so that what the peer app
starts (the runtime, the live exporter) can raise it without importing the app."""


class StartupError(Exception):
    """Something the user must fix (printed as one line, exit 1)."""
