"""The Containerfile and compose.yaml hold together: what compose names exists, HAProxy routes to its Serge services
on the image's port with the tested configuration, and the image keeps its promises (own user, a data volume, a
health check). Read, not run: scripts/container_check.sh builds and runs the image (in `.ci/run`), and no
container can start there, so compose.yaml is only checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
SERGES = {name: s for name, s in SERVICES.items() if s.get("image", "").startswith("localhost/serge")}


def final_stage() -> dict[str, list[str]]:
    """The Containerfile's last stage, its instructions by keyword (continued lines joined)."""
    text = (ROOT / "Containerfile").read_text().replace("\\\n", " ")
    stage = text.split("\nFROM ")[-1]
    found: dict[str, list[str]] = {}
    for line in stage.splitlines():
        if line.strip() and not line.startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found.setdefault(keyword.upper(), []).append(rest)
    return found


def test_the_image_runs_as_its_own_user_with_its_data_in_a_volume_and_a_health_check():
    stage = final_stage()
    assert stage["USER"][-1] not in ("root", "0")
    assert "/data" in stage["VOLUME"][-1] and "SERGE_DATA_DIR=/data" in " ".join(stage["ENV"])
    assert "/api/health" in stage["HEALTHCHECK"][-1]
    assert stage["EXPOSE"] == ["8008"] and "SERGE_PORT=8008" in " ".join(stage["ENV"])


def test_compose_names_only_services_volumes_and_files_that_exist():
    assert set(SERGES) == {"serge-a", "serge-b"} and {"db", "haproxy"} <= set(SERVICES)
    for name, service in SERVICES.items():
        assert set(service.get("depends_on", [])) <= set(SERVICES) - {name}, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).is_file(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in COMPOSE["volumes"], f"{name} mounts the undeclared volume {source}"
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
    for name, serge in SERGES.items():
        assert "data:/data" in serge["volumes"], name
        assert "/api/health" in " ".join(serge["healthcheck"]["test"]), name  # OCI images drop their HEALTHCHECK
        assert "@db:5432/" in serge["environment"]["SERGE_DATABASE_URL"], name


def test_haproxy_balances_the_compose_serge_services_with_the_tested_configuration():
    config = (ROOT / "deploy" / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s*server \w+ ([\w-]+):(\d+)", config, re.M)
    assert sorted(servers) == [(name, "8008") for name in sorted(SERGES)]
    assert "bind :8008" in config and SERVICES["haproxy"]["ports"] == ["127.0.0.1:8008:8008"]
    assert SERVICES["haproxy"]["volumes"][0].endswith(":/usr/local/etc/haproxy/haproxy.cfg:ro")
    # every line of docs/several-processes.md's tested configuration but its addresses
    doc = (ROOT / "docs" / "several-processes.md").read_text()
    tested = re.search(r"This is the tested configuration:\n\n```\n(.*?)```", doc, re.S).group(1)
    lines = {line.strip() for line in config.splitlines()}
    for line in tested.splitlines():
        if not re.match(r"\s*(bind|server) ", line):
            assert line.strip() in lines, f"deploy/haproxy.cfg lacks the tested line {line.strip()!r}"
