// An OpenID provider on 127.0.0.1 for Serge's sign-in tests: npm's oidc-provider (OpenID-certified), with the
// clients and accounts the test writes into a JSON file, given as the only argument:
//   {"port": 4100, "clients": [{client_id, client_secret, redirect_uris, post_logout_redirect_uris}],
//    "accounts": {"ada": {"preferred_username": "ada", "email": "...", "groups": ["staff"]}}}
// Its development sign-in pages take any password for an account the file names. It prints "ready" once it
// listens. For tests only: the cookie key below is no secret.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const issuer = `http://127.0.0.1:${config.port}`;

const provider = new Provider(issuer, {
  clients: config.clients,
  cookies: { keys: ["serge-tests-only"] },
  pkce: { required: () => true },
  conformIdTokenClaims: false, // the scopes' claims in the ID token itself, as many providers put them
  claims: {
    openid: ["sub"],
    profile: ["name", "preferred_username"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  async findAccount(ctx, id) {
    const claims = config.accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
});
provider.listen(config.port, "127.0.0.1", () => console.log("ready"));
