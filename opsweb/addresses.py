"""The multiaddr argument type of the console scripts (--initial-peers, --host-maddrs,
--announce-maddrs): a bad address is a one-line usage error before any network starts,
not hivemind's traceback after the DHT child forked."""
import argparse


def multiaddr(text: str) -> str:
    """A libp2p multiaddr, e.g. /ip4/203.0.113.5/tcp/31337/p2p/12D3KooW..., checked by the
    multiaddr package (what hivemind parses it with later, after the network started)."""
    from multiaddr import Multiaddr
    try:
        Multiaddr(text)
    except Exception as exc:  # multiaddr raises several kinds, all of them meaning "not an address"
        why = str(exc).split(" (string:")[0].split("': ", 1)[-1]
        raise argparse.ArgumentTypeError(f"not a multiaddr: {text!r} ({why}); expected e.g. "
                                         "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooW...") from None
    return text
