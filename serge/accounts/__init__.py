"""Accounts: who may use Serge, proved by a password, an API key or a login session."""

from serge.accounts.service import LOCAL_USER, Accounts, InvalidAccountInput, LoginFailed
from serge.accounts.sessions import LoginSessions, load_secret
from serge.accounts.usage import QuotaExceeded, Usage, UserQuota

__all__ = ["LOCAL_USER", "Accounts", "InvalidAccountInput", "LoginFailed", "LoginSessions", "QuotaExceeded", "Usage",
           "UserQuota", "load_secret"]
