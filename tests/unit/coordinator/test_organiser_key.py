"""The organiser key file (coordinator/organiser_key.py): created once, 0600, reloaded as the
same key, refused when loose or not a key."""
import os

import pytest

from coordinator.organiser_key import OrganiserKeyError, load_or_create_organiser_key, run_address
from protocol.signing import public_key_text, split_run_address


def test_created_once_private_and_reloaded_as_the_same_key(tmp_path):
    path = tmp_path / "keys" / "organiser.pem"
    key, created = load_or_create_organiser_key(path)
    assert created and path.stat().st_mode & 0o777 == 0o600
    again, created_again = load_or_create_organiser_key(path)
    assert not created_again and public_key_text(again) == public_key_text(key)
    name, pinned = split_run_address(run_address("demo", key))
    assert (name, pinned) == ("demo", public_key_text(key))


def test_a_key_others_can_read_is_refused(tmp_path):
    path = tmp_path / "organiser.pem"
    load_or_create_organiser_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(OrganiserKeyError, match="chmod 600"):
        load_or_create_organiser_key(path)


@pytest.mark.parametrize("content", [b"", b"not a key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_something_else_in_the_file_is_refused_not_overwritten(tmp_path, content):
    path = tmp_path / "organiser.pem"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(OrganiserKeyError, match="not an Ed25519 organiser key"):
        load_or_create_organiser_key(path)
    assert path.read_bytes() == content
