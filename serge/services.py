"""`Services`: what Serge keeps, opened once from the settings, by the server and by the command line alike.

The database and the services over it: accounts and their sign-ins, groups and the audit log, usage and
its reservations, tool servers and the answers to their calls, presets, documents and knowledge, chats and
stored responses. `Services.open(settings)` opens the parts that need only the database (what `serge users`,
`serge mcp` or `serge usage` use); with an engine (`Services.open(settings, engine)`) the parts that
generate or embed too; `serving=True` starts what runs in the background of a server (the knowledge
indexer, the reservations' heartbeat, the shared replies of several processes, the sign-in sync).
`close()` stops them in order. The web layer reaches them as one typed dependency (`serge.web.http.context.services`). It wires;
it decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from serge.accounts import Accounts, LoginSessions, Usage, load_secret
from serge.accounts.groups import Groups
from serge.accounts.signin.grants import ProviderGrants
from serge.accounts.signin.ldap import LdapSignIn, ldap_sign_in
from serge.accounts.signin.oidc import OpenIdSignIn, open_id_sign_in
from serge.accounts.signin.proxy import ProxySignIn
from serge.accounts.signin.sync import SignInSync, SyncLoop
from serge.accounts.reservations import LEASE_S, Reservations, reserve_streams
from serge.chats import ChatService, Indexer, Knowledge, Presets
from serge.chats.documents import ChatDocuments
from serge.chats.replies.running import SharedReplies, process_name, shared_by_processes
from serge.chats.responses import StoredResponses
from serge.chats.tools import ChatTools, ToolDecisions
from serge.engine import Engine
from serge.settings import Settings
from serge.store import (AccountStore, ChatStore, CollectionStore, Database, DecisionStore, DocumentStore, FileStore,
                         PresetStore, ResponseStore, UsageStore)
from serge.store.people.audit import AuditStore
from serge.store.people.groups import GroupStore
from serge.store.people.sign_ins import SignInStore
from serge.store.tools import ToolServerStore
from serge.store.usage.reservations import ReservationStore
from serge.tools import ToolServers
from serge.tools.secrets import scrub_logs


@dataclass
class Services:
    settings: Settings
    database: Database
    accounts: Accounts
    sessions: LoginSessions
    sign_ins: SignInStore
    groups: Groups
    audit: AuditStore
    usage: Usage
    reservations: Reservations
    tools: ToolServers
    decisions: ToolDecisions
    grants: ProviderGrants  # the providers' refresh tokens, sealed
    sign_in_sync: SignInSync  # asks the providers about the people they signed in
    oidc: OpenIdSignIn | None = None  # the OpenID Connect sign-in, where SERGE_OIDC_ISSUER is set
    ldap: LdapSignIn | None = None  # the directory's, where SERGE_LDAP_URL is set
    proxy_sign_in: ProxySignIn | None = None
    # with an engine
    engine: Engine | None = None
    documents: ChatDocuments | None = None
    knowledge: Knowledge | None = None
    presets: Presets | None = None
    chats: ChatService | None = None
    responses: StoredResponses | None = None
    shared: SharedReplies | None = None  # replies in progress in the database, where processes share it
    _indexer: Indexer | None = None
    _sync_loop: SyncLoop | None = None

    @classmethod
    def open(cls, settings: Settings, engine: Engine | None = None, *, serving: bool = False) -> Services:
        scrub_logs()  # before a tool server's URL can reach a log line
        database = Database(settings.database, settings.database_busy_timeout_s)
        database.migrate()  # schema changes are applied at start, before anything reads
        accounts = AccountStore(database)
        sign_ins = SignInStore(database, settings.new_users_pending)
        usage = Usage(UsageStore(database))
        reservations = Reservations(usage, ReservationStore(database, process_name(), LEASE_S))
        secret, groups = load_secret(settings.data_dir), Groups(GroupStore(database))
        grants, oidc = ProviderGrants(sign_ins, secret), open_id_sign_in(settings, sign_ins)
        ldap = ldap_sign_in(settings)
        made = cls(
            settings=settings, database=database, accounts=Accounts(accounts),
            sessions=LoginSessions(accounts, secret, timedelta(days=settings.session_days)),
            sign_ins=sign_ins, groups=groups, audit=AuditStore(database), usage=usage,
            reservations=reservations.start() if serving else reservations,
            tools=ToolServers.of(ToolServerStore(database), settings),  # MCP servers start on first use
            decisions=ToolDecisions(DecisionStore(database)), grants=grants,
            sign_in_sync=SignInSync(sign_ins, groups, database, grants, ldap, oidc),
            oidc=oidc, ldap=ldap,
            proxy_sign_in=ProxySignIn(settings.proxy_user_header, settings.proxy_user_from, sign_ins)
            if settings.proxy_user_header else None)
        if serving and settings.sign_in_sync_s and made.sign_in_sync.has_providers:
            made._sync_loop = SyncLoop(made.sign_in_sync, settings.sign_in_sync_s).start()
        if engine is not None:
            made._with_engine(engine, serving)
        return made

    def _with_engine(self, engine: Engine, serving: bool) -> None:
        settings, database = self.settings, self.database
        self.engine = engine
        store = DocumentStore(database, FileStore(settings.data_dir / "files"))
        self.documents = ChatDocuments(store, engine)
        collections = CollectionStore(store)
        # the indexer goes on with what a stopped server left unindexed
        self._indexer = Indexer(collections, self.documents).start() if serving else None
        self.knowledge = Knowledge(collections, self._indexer)
        self.presets = Presets(PresetStore(database), engine, self.knowledge, self.documents)
        if not serving:
            return
        chat_store = ChatStore(database)
        # several processes may share a server database: replies in progress and users' streams are kept there too
        self.shared = SharedReplies(database) if shared_by_processes(database) else None
        chat_tools = ChatTools(self.tools, chat_store, engine, self.decisions, steps=settings.tool_steps)
        self.chats = ChatService(chat_store, engine, self.documents, self.knowledge, chat_tools, self.shared,
                                 self.presets, warm=settings.warm_chats, reserve=reserve_streams)
        self.chats.recover()  # replies cut off by a crash are shown as interrupted
        self.responses = StoredResponses(ResponseStore(database))

    def close(self) -> None:
        """Stop what runs (replies are saved as incomplete, the indexer stops between two batches), then the
        database; the tool servers Serge started are closed by whoever started them (`await tools.close()`)."""
        if self.chats is not None:
            self.chats.close()
        if self._indexer is not None:
            self._indexer.close()
        if self._sync_loop is not None:
            self._sync_loop.close()
        self.reservations.close()
        self.database.close()
