"""Debian's OpenLDAP server (slapd) with a small directory, started on 127.0.0.1 by a test: a folder of its own
for its configuration and database, the entries loaded with ldapadd (ldap-utils), stopped at the end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SLAPD = Path("/usr/sbin/slapd")
SUFFIX = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "directory-admin-password"
SCHEMAS = ("core", "cosine", "inetorgperson", "nis")


def installed() -> bool:
    return SLAPD.exists() and shutil.which("ldapadd") is not None


def entries(people: dict[str, dict], groups: dict[str, list[str]]) -> str:
    """LDIF for the base, ou=people with `people` (uid -> {password, mail}) and ou=groups (cn -> member uids)."""
    parts = [f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n",
             f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n",
             f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n"]
    for uid, person in people.items():
        parts.append(f"dn: uid={uid},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\n"
                     f"sn: {uid}\nmail: {person['mail']}\nuserPassword: {person['password']}\n")
    for cn, members in groups.items():
        listed = "".join(f"member: uid={uid},ou=people,{SUFFIX}\n" for uid in members)
        parts.append(f"dn: cn={cn},ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: {cn}\n{listed}")
    return "\n".join(parts)


@contextmanager
def directory(folder: Path, port: int, ldif: str) -> Iterator[str]:
    """slapd serving `ldif` at ldap://127.0.0.1:port until the block ends; yields its URL."""
    (folder / "db").mkdir(parents=True)
    config = folder / "slapd.conf"
    config.write_text("".join(f"include /etc/ldap/schema/{s}.schema\n" for s in SCHEMAS) + (
        "modulepath /usr/lib/ldap\nmoduleload back_mdb\n"
        f"pidfile {folder / 'slapd.pid'}\n"
        f"database mdb\nmaxsize 10485760\nsuffix \"{SUFFIX}\"\nrootdn \"{ADMIN_DN}\"\nrootpw {ADMIN_PASSWORD}\n"
        f"directory {folder / 'db'}\n"))
    url = f"ldap://127.0.0.1:{port}"
    with (folder / "slapd.log").open("w") as log:
        server = subprocess.Popen([str(SLAPD), "-f", str(config), "-h", f"{url}/", "-d", "0"], stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"slapd did not start: {(folder / 'slapd.log').read_text()}") from None
                time.sleep(0.05)
        (folder / "entries.ldif").write_text(ldif)
        subprocess.run(["ldapadd", "-x", "-H", url, "-D", ADMIN_DN, "-w", ADMIN_PASSWORD, "-f",
                        str(folder / "entries.ldif")], check=True, capture_output=True)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def remove(url: str, dn: str) -> None:
    """Delete an entry, as the directory's admin does when someone leaves."""
    subprocess.run(["ldapdelete", "-x", "-H", url, "-D", ADMIN_DN, "-w", ADMIN_PASSWORD, dn], check=True,
                   capture_output=True)
