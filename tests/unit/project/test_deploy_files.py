"""Docker cannot build here: Dockerfile, docker-compose.yml and deploy/ are kept correct by
these reading checks (hadolint-style rules, a parse of the compose file, and the dashboard's
metric names against the ones the code exports)."""
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")   # PyYAML: a dev dependency (and hivemind's)

ROOT = Path(__file__).resolve().parents[3]
METRIC_SOURCES = ("peer/metrics.py", "coordinator/status_page.py")


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def exported_metrics() -> set[str]:
    text = "".join((ROOT / p).read_text() for p in METRIC_SOURCES)
    return set(re.findall(r'"(skippipe_[a-z_]+)"', text))


def test_dockerfile_hadolint_style_rules():
    steps = dockerfile()
    (base,) = [args for op, args in steps if op == "FROM"]
    image, _, tag = base.partition(":")
    assert tag and tag != "latest", f"pin the base image's tag: {base}"
    users = [(i, args) for i, (op, args) in enumerate(steps) if op == "USER"]
    assert users and users[-1][1] not in ("root", "0"), "the image must drop root"
    (entry,) = [args for op, args in steps if op == "ENTRYPOINT"]
    assert json.loads(entry), "ENTRYPOINT in exec form: the script is PID 1 and gets docker stop's SIGTERM"
    assert not any(op == "ADD" for op, _ in steps), "COPY, not ADD"
    assert not any(op == "RUN" and re.search(r"\bapt-get install\b(?!.*--no-install-recommends)", a)
                   for op, a in steps)


def test_dockerfile_volumes_exist_and_are_owned_by_the_user_before_it_drops_root():
    steps = dockerfile()
    user_at = max(i for i, (op, _) in enumerate(steps) if op == "USER")
    user = steps[user_at][1]
    before = " && ".join(a for op, a in steps[:user_at] if op == "RUN")
    made = [d for m in re.findall(r"mkdir -p ([^&]+)", before) for d in m.split()]
    chowned = re.findall(rf"chown -R {user}:{user} (\S+)", before)
    volumes = [v for op, a in steps if op == "VOLUME" for v in json.loads(a)]
    assert volumes
    for volume in volumes + ["/home/peer/shared"]:   # the compose file's shared volume too
        assert volume in made, f"{volume} is not created before USER {user}"
        assert any(volume == c or volume.startswith(c + "/") for c in chowned), f"{volume} is not {user}'s"


def test_dockerfile_installs_dependencies_in_a_layer_that_does_not_change_with_the_source():
    steps = dockerfile()
    copies = [(i, a.split()) for i, (op, a) in enumerate(steps) if op == "COPY"]
    pyproject_at = next(i for i, args in copies if args[0] == "pyproject.toml")
    assert copies[0][1][:-1] == ["pyproject.toml"], "the first COPY brings pyproject.toml alone"
    dep_install = next(i for i, (op, a) in enumerate(steps) if op == "RUN" and "pip install -r" in a)
    first_source = min(i for i, args in copies if args[0] != "pyproject.toml")
    assert pyproject_at < dep_install < first_source
    # ... and every package pyproject installs is copied in afterwards
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    copied = {args[0] for _, args in copies}
    assert {p.split(".")[0] for p in packages} <= copied
    assert any(op == "RUN" and "pip install --no-deps ." in a for op, a in steps[first_source:])


def test_compose_file_parses_and_wires_peers_to_a_healthy_coordinator():
    c = compose()
    services = c["services"]
    assert {"coordinator", "peer1", "peer2", "peer3", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        if "image" in svc and "build" not in svc:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", svc["image"]) and not svc["image"].endswith(":latest"), name
    coord = services["coordinator"]
    assert coord["healthcheck"]["test"][0] == "CMD"
    flags = dict(a.split("=", 1) for a in coord["command"] if "=" in a)
    maddrs_file = flags["--maddrs-file"]
    for name in ("peer1", "peer2", "peer3"):
        peer = services[name]
        assert peer["depends_on"]["coordinator"]["condition"] == "service_healthy"
        script = " ".join(peer["entrypoint"])
        assert maddrs_file in script, f"{name} must read the coordinator's {maddrs_file}"
    # the healthcheck asks the status page the coordinator serves
    assert f":{flags['--status-port']}/api/status" in " ".join(coord["healthcheck"]["test"])


def test_compose_starts_prometheus_with_the_scrape_config_and_it_names_every_target():
    c = compose()
    prom = c["services"]["prometheus"]
    (mount,) = [v for v in prom["volumes"] if "prometheus.yml" in v]
    source, target = mount.split(":")[:2]
    assert (ROOT / source).is_file() and f"--config.file={target}" in prom["command"]
    config = yaml.safe_load((ROOT / source).read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in config["scrape_configs"]}
    coord_flags = dict(a.split("=", 1) for a in c["services"]["coordinator"]["command"] if "=" in a)
    assert targets["skippipe-coordinator"] == [f"coordinator:{coord_flags['--status-port']}"]
    peers = [n for n in c["services"] if n.startswith("peer")]
    port = c["x-peer"]["environment"]["SKIPPIPE_PEER_METRICS_PORT"]
    assert sorted(targets["skippipe-peer"]) == sorted(f"{p}:{port}" for p in peers)
    assert c["x-peer"]["environment"]["SKIPPIPE_PEER_METRICS_HOST"] == "0.0.0.0"
    for svc in ("grafana",):
        for volume in c["services"][svc]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume


def test_grafana_dashboard_uses_only_metrics_the_code_exports():
    dash = json.loads((ROOT / "deploy/grafana/dashboards/skippipe.json").read_text())
    exported = exported_metrics()
    assert len(exported) > 20
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    used = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == uid
        for target in panel["targets"]:
            used |= {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"skippipe_[a-z_]+", target["expr"])}
    assert used and used <= exported, f"not exported by the code: {used - exported}"
    assert any(m.startswith("skippipe_peer_") for m in used) and any(m.startswith("skippipe_coordinator_") for m in used)


@pytest.mark.parametrize("doc", ["README.md", "docs/deployment.md"])
def test_documented_docker_command_is_reachable_from_other_peers(doc):
    text = (ROOT / doc).read_text()
    section = text.split("## Docker", 1)[1]
    runs = [line for line in re.findall(r"```\n(.*?)```", section, re.S)[0].replace("\\\n", " ").splitlines()
            if line.startswith("docker run")]
    assert runs
    for line in runs:
        words = shlex.split(line)
        published = "-p" in words and words[words.index("-p") + 1].startswith("31337:31337")
        assert published or "--network" in words and words[words.index("--network") + 1] == "host", line
        if published:
            assert words[words.index("--host-maddrs") + 1] == "/ip4/0.0.0.0/tcp/31337", line
