"""The ways to sign in besides a password: OpenID Connect, LDAP, a trusted proxy header, and provisioning at first sign-in."""
