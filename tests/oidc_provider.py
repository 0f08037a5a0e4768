"""npm's oidc-provider (the OpenID-certified Node implementation, pinned in tests/oidc/package.json; `make test`
and .ci/run install it), started by a test on 127.0.0.1 with the clients and accounts the test names, and
changed while it runs: an account removed, or the token endpoint answering 503 (tests/oidc/provider.js).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from pathlib import Path
from urllib.parse import urljoin

import httpx

PROVIDER = Path(__file__).parent / "oidc"
NODE = shutil.which("node")
CLIENT_ID, CLIENT_SECRET = "serge", "a-secret-for-tests-only"


def installed() -> bool:
    return bool(NODE) and (PROVIDER / "node_modules" / "oidc-provider").is_dir()


class RunningProvider:
    def __init__(self, url: str, config: Path, process: subprocess.Popen) -> None:
        self.url = url
        self.config = config
        self.process = process

    def stop(self) -> None:
        """Down: its port closed."""
        self.process.terminate()
        self.process.wait(10)

    def change(self, **changes) -> None:
        """Rewrite what the provider reads at each use: `accounts`, `failing`."""
        self.config.write_text(json.dumps(json.loads(self.config.read_text()) | changes))

    def remove(self, account: str) -> None:
        accounts = json.loads(self.config.read_text())["accounts"]
        self.change(accounts={k: v for k, v in accounts.items() if k != account})


@contextmanager
def oidc_provider(folder: Path, port: int, serge: str, accounts: dict[str, dict], *, refresh_tokens: bool = False
                  ) -> Iterator[RunningProvider]:
    """The provider at http://127.0.0.1:port with one client, Serge at `serge` (with refresh tokens for
    offline_access when `refresh_tokens`), until the block ends."""
    issuer = f"http://127.0.0.1:{port}"
    config = folder / "provider.json"
    client = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "redirect_uris": [f"{serge}/auth/oidc/callback"],
              "post_logout_redirect_uris": [f"{serge}/login"]}
    if refresh_tokens:
        client["grant_types"] = ["authorization_code", "refresh_token"]
    config.write_text(json.dumps({"port": port, "clients": [client], "accounts": accounts, "failing": False}))
    with (folder / "provider.log").open("w") as log:
        provider = subprocess.Popen([NODE, str(PROVIDER / "provider.js"), str(config)], stdout=log,
                                    stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if provider.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenID provider did not start: {(folder / 'provider.log').read_text()}")
            time.sleep(0.1)
        yield RunningProvider(issuer, config, provider)
    finally:
        provider.terminate()
        provider.wait(10)


FORM = re.compile(r'<form[^>]*action="([^"]+)"[^>]*>(.*?)</form>', re.S)
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


def sign_in_over_http(serge: str, name: str) -> httpx.Client:
    """What a browser does on the provider's development pages (its login form, then its consent form), done
    with httpx: a client signed in to Serge as `name`."""
    client = httpx.Client(base_url=serge, timeout=30, follow_redirects=True)
    page = client.get("/auth/oidc/start", params={"next": "/api/me"})
    for _ in range(4):  # login, consent
        form = FORM.search(page.text) if "<form" in page.text else None
        if form is None:
            break
        fields = dict(HIDDEN.findall(form.group(2)))
        if 'name="login"' in form.group(2):
            fields |= {"login": name, "password": "any password will do"}
        page = client.post(urljoin(str(page.url), unescape(form.group(1))), data=fields)
    assert page.status_code == 200 and page.json()["name"] == name, page.text[:500]
    return client
