"""Settings -> a command line, from the same declarations a program's parser reads: so a
launcher that starts a program names its settings by their destination (`checkpoint_dir`)
and cannot spell a flag the program does not have."""
import argparse
from typing import Any, Mapping


class UnknownSetting(ValueError):
    pass


def argv_for(parser: argparse.ArgumentParser, settings: Mapping[str, Any]) -> list[str]:
    """The flags that give `parser` these settings ({dest: value}); a None value is left out
    (the program's default), a switch appears only when on."""
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    argv: list[str] = []
    for dest, value in settings.items():
        action = actions.get(dest)
        if action is None:
            raise UnknownSetting(f"{parser.prog} has no setting {dest!r}")
        if value is None:
            continue
        flag = max(action.option_strings, key=len)   # the long form, as people write it
        if action.nargs == 0:
            if bool(value) == (action.const is True):   # store_true on, or store_false off
                argv.append(flag)
        elif action.nargs in ("+", "*"):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv
