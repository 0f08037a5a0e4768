"""The stores behind sign-in, groups, shares and the audit log, on SQLite and (where CI names one) PostgreSQL: a
sign-in on its way is taken once, a provider's person is found by who they are there and never by name, a
provider's groups claim moves its own groups only, a share hides a name from everyone outside its groups, the
audit log keeps who did what, newest first, and a provider's refresh token is kept sealed and redeemed by one
process at a time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from serge.access import acting
from serge.accounts.signin.grants import ProviderGrants
from serge.store import AccountStore
from serge.store.people.audit import AuditStore, note
from serge.store.people.groups import GroupExists, GroupStore
from serge.store.people.sign_ins import ExternalUser, PendingRecord, SignInStore
from serge.store.tables import ProviderGrant, now

PENDING = PendingRecord("a-nonce", "a-verifier", "http://127.0.0.1/auth/oidc/callback", "/c/1")


def person(subject: str, *names: str, admin: bool | None = None) -> ExternalUser:
    return ExternalUser(source="oidc", external_id=f"oidc:https://id.example#{subject}", names=names,
                        email=f"{subject}@example.org", admin=admin)


def test_a_sign_in_on_its_way_is_taken_once_and_not_after_it_expires(database):
    store = SignInStore(database)
    store.begin("state-1", PENDING, timedelta(minutes=10))
    assert store.take("state-1") == PENDING
    assert store.take("state-1") is None, "a state answers once"
    store.begin("state-2", PENDING, timedelta(seconds=-1))
    assert store.take("state-2") is None, "past its end"
    assert store.take("never-sent") is None


def test_a_provider_person_is_found_by_subject_and_a_taken_name_gets_the_next_one(database):
    accounts, store = AccountStore(database), SignInStore(database)
    local = accounts.add_user("ada", "a-password-hash", admin=True)
    first = store.provision(person("u1", "ada", "ada-1a2b3c4d"))
    assert first.name == "ada-1a2b3c4d" and first.id != local.id and not first.admin
    again = store.provision(person("u1", "someone-else"))
    assert again.id == first.id and again.name == "ada-1a2b3c4d"
    assert store.find("oidc:https://id.example#u1").id == first.id
    assert accounts.credentials("ada")[0].id == local.id


def test_the_last_admin_is_never_demoted_by_a_claim(database):
    store = SignInStore(database)
    only = store.provision(person("u2", "bo", admin=True))
    assert store.provision(person("u2", "bo", admin=False)).admin, "someone must manage the users"
    store.provision(person("u3", "cy", admin=True))
    assert not store.provision(person("u2", "bo", admin=False)).admin
    assert only.admin


def test_a_claim_moves_its_own_groups_and_leaves_an_admins(database):
    users, groups = SignInStore(database), GroupStore(database)
    dee = users.provision(person("u4", "dee"))
    groups.add("helpdesk")
    groups.join("helpdesk", "dee")
    assert groups.sync(dee.id, "oidc", ["staff", "ml"]) == ["helpdesk", "ml", "staff"]
    assert groups.sync(dee.id, "oidc", ["staff"]) == ["helpdesk", "staff"]
    assert groups.group("ml").source == "oidc" and groups.group("ml").members == ()
    with pytest.raises(GroupExists):
        groups.add("staff")


def test_a_share_hides_a_name_from_everyone_outside_its_groups(database):
    users, groups = SignInStore(database), GroupStore(database)
    ed, flo = users.provision(person("u5", "ed")), users.provision(person("u6", "flo"))
    groups.add("ml")
    groups.add("ops")
    groups.join("ml", "ed")
    groups.share("model", "Team-Model", "ml")
    groups.share("model", "team-model", "ops")
    groups.share("tool_server", "clock", "ops")
    assert groups.hidden_from(ed.id) == {"tool_server": frozenset({"clock"})}
    assert groups.hidden_from(flo.id) == {"model": frozenset({"team-model"}), "tool_server": frozenset({"clock"})}
    groups.remove("ops")
    assert groups.hidden_from(ed.id) == {}
    groups.unshare("model", "team-model", "ml")
    assert groups.hidden_from(flo.id) == {} and groups.shares() == []


def test_the_audit_log_keeps_who_did_what_newest_first(database):
    with acting("ada"):
        note(database, "group.add", "ml")
    with acting("cli:root"):
        note(database, "share", "model x with ml")
    note(database, "user.cut_off", "bo")
    entries = AuditStore(database).entries()
    assert [(e.actor, e.action, e.target) for e in entries] == [
        ("serge", "user.cut_off", "bo"), ("cli:root", "share", "model x with ml"), ("ada", "group.add", "ml")]
    assert len(AuditStore(database).entries(limit=1)) == 1


def test_a_refresh_token_is_kept_sealed_and_claimed_by_one_process_at_a_time(database):
    store = SignInStore(database)
    eve = store.provision(person("u9", "eve"))
    grants, other_process = ProviderGrants(store, b"the-data-dir-secret"), ProviderGrants(store, b"the-data-dir-secret")
    grants.keep(eve.id, "the-refresh-token")
    with database.session() as session:
        assert "the-refresh-token" not in session.get(ProviderGrant, eve.id).sealed  # never in the clear
    lease = timedelta(minutes=1)
    claimed = list(grants.due("oidc", now(), lease))
    assert [(g.user.name, g.external, g.refresh_token) for g in claimed] == [("eve", "https://id.example#u9",
                                                                              "the-refresh-token")]
    assert list(other_process.due("oidc", now(), lease)) == [], "being redeemed elsewhere"
    grants.renewed(eve.id, "the-next-token")
    assert list(other_process.due("oidc", now() - timedelta(minutes=5), lease)) == [], "checked a moment ago"
    assert [g.refresh_token for g in other_process.due("oidc", now(), lease)] == ["the-next-token"]
    other_process.unanswered(eve.id)
    assert [g.refresh_token for g in ProviderGrants(store, b"a-replaced-secret").due("oidc", now(), lease)] == [None]
    grants.renewed(eve.id, None)
    assert list(grants.due("oidc", now(), lease)) == []


def test_cutting_someone_off_twice_ends_their_logins_and_keys_once(database):
    accounts, store = AccountStore(database), SignInStore(database)
    fay = store.provision(person("u10", "fay"))
    accounts.add_session("a-session-hash", fay.id, timedelta(days=1))
    accounts.add_key(fay.id, "laptop", "sk-serge-abc", "a-key-hash")
    first, second = store.cut_off(fay.id), store.cut_off(fay.id)  # two processes' rounds, one after the other
    assert (first.sessions, first.keys, second.anything) == (1, 1, False)
    assert accounts.user_for_session("a-session-hash") is None and accounts.user_for_key("a-key-hash") is None
