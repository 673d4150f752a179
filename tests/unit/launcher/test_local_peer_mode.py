"""SKIPPIPE_LOCAL_PEERS picks how the launcher starts local peers; a typo is a usage error."""
import sys

import pytest

from launcher.cli import main
from launcher.fork_server import forking_enabled, start_mode


@pytest.mark.parametrize("value, mode", [(None, "fork"), ("", "fork"), ("exec", "exec"), (" Fork ", "fork")])
def test_the_mode_and_its_default(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("SKIPPIPE_LOCAL_PEERS", raising=False)
    else:
        monkeypatch.setenv("SKIPPIPE_LOCAL_PEERS", value)
    assert start_mode() == mode
    assert forking_enabled() == (mode == "fork" and sys.platform.startswith("linux"))


def test_an_unknown_mode_stops_the_launcher_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setenv("SKIPPIPE_LOCAL_PEERS", "spawn")
    assert main(["--peers", "2", "--stages", "2"]) == 2
    assert "SKIPPIPE_LOCAL_PEERS must be fork or exec, got 'spawn'" in capsys.readouterr().err
