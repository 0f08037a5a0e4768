// An OpenID provider on 127.0.0.1 for Serge's sign-in tests: npm's oidc-provider (OpenID-certified), with the
// clients and accounts the test writes into a JSON file, given as the only argument:
//   {"port": 4100, "clients": [{client_id, client_secret, redirect_uris, post_logout_redirect_uris, grant_types}],
//    "accounts": {"ada": {"preferred_username": "ada", "email": "...", "groups": ["staff"]}}, "failing": false}
// The accounts and "failing" are read again at each use, so a test removes an account (or changes its groups)
// by rewriting the file; "failing": true makes the token endpoint answer 503, as a provider in trouble does.
// A client whose grant_types include "refresh_token" gets a refresh token when it asks for offline_access.
// Its development sign-in pages take any password for an account the file names. It prints "ready" once it
// listens. For tests only: the cookie key below is no secret.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const read = () => JSON.parse(readFileSync(process.argv[2], "utf8"));
const config = read();
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
    const claims = read().accounts[id];
    if (!claims) return undefined; // removed: its refresh tokens answer invalid_grant
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
});
provider.use(async (ctx, next) => {
  if (ctx.path === "/token" && read().failing) {
    ctx.status = 503;
    ctx.body = "<html><body>Down for maintenance</body></html>";
    return;
  }
  await next();
});
provider.listen(config.port, "127.0.0.1", () => console.log("ready"));
