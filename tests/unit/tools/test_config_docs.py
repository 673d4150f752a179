"""docs/configuration.md, the configuration reference, is generated from the console scripts'
parsers (tools/gen_config_docs.py) and kept in sync with them."""
import argparse

from tools import gen_config_docs as gen

REGENERATE_HINT = (f"{gen.OUTPUT.relative_to(gen.ROOT)} is out of date: regenerate it with "
                   f"`{gen.REGENERATE}` (from the repository root) and commit it")


def sections(text: str) -> dict[str, str]:
    """{program title: its part of the reference} ("skippipe-coordinator plan": ...)."""
    return {chunk.split("\n", 1)[0].strip(): chunk for chunk in text.split("\n## ")[1:]}


def test_configuration_reference_is_up_to_date():
    assert gen.OUTPUT.exists(), REGENERATE_HINT
    assert gen.OUTPUT.read_text() == gen.render(), REGENERATE_HINT


def test_configuration_reference_documents_every_flag():
    """Independent of the renderer: every option of every parser, and every subcommand, has a
    row in its program's section."""
    documented = sections(gen.OUTPUT.read_text())
    titles = [p.title for p in gen.programs()]
    assert {"skippipe-peer", "skippipe-coordinator run", "skippipe-coordinator plan", "skippipe-swarm"} <= set(titles)
    missing = []
    for program in gen.programs():
        section = documented.get(program.title)
        if section is None:
            missing.append(program.title)
            continue
        for action in program.parser._actions:
            if action.dest in ("help", "version") or isinstance(action, argparse._SubParsersAction):
                continue
            name = max(action.option_strings, key=len) if action.option_strings else (action.metavar or action.dest)
            if f"| `{name}`" not in section:
                missing.append(f"{program.title} {name}")
    assert not missing, f"the configuration reference lacks {missing}: {REGENERATE_HINT}"


def test_every_script_of_pyproject_is_covered():
    scripts = gen.console_scripts()
    assert set(scripts) == {"skippipe-peer", "skippipe-coordinator", "skippipe-swarm"}
    covered = {p.title.split(" ")[0] for p in gen.programs()}
    assert covered == set(scripts)


def test_defaults_do_not_depend_on_this_machine():
    text = gen.render()
    assert str(gen.Path.home()) + "/" not in text or len(str(gen.Path.home())) <= 1
    assert "`~/.cache/skippipe`" in text


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    monkeypatch.setattr(gen, "OUTPUT", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert gen.REGENERATE in capsys.readouterr().err
    assert gen.main([]) == 0 and stale.read_text() == gen.render()
    assert gen.main(["--check"]) == 0
