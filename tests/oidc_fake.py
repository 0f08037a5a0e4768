"""An OpenID provider the test controls, on 127.0.0.1: its discovery document, its JWKS and a token endpoint
that answers with whatever ID token the test mints, so a forged token can be sent exactly as a provider
would send it. Its authorization endpoint is never visited: the test reads the state and nonce from the
URL Serge sends the browser to and calls Serge's callback itself. (The sign-in through a real provider's
pages is tests/test_sign_in_oidc_browser.py, with npm's oidc-provider.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from joserfc import jwt
from joserfc.jwk import RSAKey

CLIENT_ID = "serge"
CLIENT_SECRET = "client-secret-for-tests"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class FakeProvider:
    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "good"})
        self.other_key = RSAKey.generate_key(2048, parameters={"kid": "good"})  # same kid, not published
        self.url = ""  # set once it listens
        self.mint: Callable[[], str] = lambda: ""  # the ID token the token endpoint answers with
        self.token_requests: list[dict] = []
        self.app = self._app()

    # --- tokens -----------------------------------------------------------------------------
    def claims(self, nonce: str, **changes) -> dict:
        now = int(time.time())
        claims = {"iss": self.url, "sub": "u-ada", "aud": CLIENT_ID, "iat": now, "exp": now + 300, "nonce": nonce,
                  "preferred_username": "ada", "email": "ada@example.org", "groups": ["staff"]}
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, nonce: str, *, key: RSAKey | None = None, **changes) -> str:
        """A well-made ID token (signed with the published key unless `key` says otherwise)."""
        return jwt.encode({"alg": "RS256", "kid": "good"}, self.claims(nonce, **changes), key or self.key)

    def unsigned(self, nonce: str) -> str:
        """`alg: none`: claims anyone can write."""
        header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        return f"{header}.{b64(json.dumps(self.claims(nonce)).encode())}."

    def hmac_with_public_key(self, nonce: str) -> str:
        """HS256 keyed with the provider's public key, which anyone can read: the algorithm-confusion forgery."""
        header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "good"}).encode())
        body = f"{header}.{b64(json.dumps(self.claims(nonce)).encode())}"
        secret = self.key.as_pem(private=False)
        return f"{body}.{b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())}"

    # --- the provider's endpoints -----------------------------------------------------------
    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/api/health")  # what the tests' ServerThread waits for
        def health():
            return {"status": "ok"}

        @app.get("/.well-known/openid-configuration")
        def discovery():
            return {"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                    "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
                    "end_session_endpoint": f"{self.url}/session/end", "response_types_supported": ["code"],
                    "subject_types_supported": ["public"],
                    # as a careless provider might announce: Serge must refuse an unsigned or HMAC token anyway
                    "id_token_signing_alg_values_supported": ["RS256", "HS256", "none"],
                    "code_challenge_methods_supported": ["S256"]}

        @app.get("/jwks")
        def jwks():
            return {"keys": [self.key.as_dict(private=False)]}

        @app.post("/token")
        async def token(request: Request):
            form = dict(await request.form())
            self.token_requests.append({**form, "authorization": request.headers.get("authorization", "")})
            if form.get("code") != "good-code":
                return JSONResponse({"error": "invalid_grant", "error_description": "grant request is invalid"},
                                    status_code=400)
            return {"access_token": "an-access-token", "token_type": "Bearer", "expires_in": 300,
                    "id_token": self.mint()}

        return app
