"""Accounts: who may use Serge, proved by a password, an API key or a login session."""

from serge.accounts.service import (
    KEY_PREFIX, LOCAL_USER, Accounts, InvalidAccountInput, LoginFailed, check_name, check_password,
)
from serge.accounts.sessions import LoginSessions, load_secret

__all__ = [
    "KEY_PREFIX", "LOCAL_USER", "Accounts", "InvalidAccountInput", "LoginFailed", "LoginSessions", "check_name",
    "check_password", "load_secret",
]
