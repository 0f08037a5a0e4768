"""The bodies of Ollama's `/api/chat` and `/api/generate`, and their translation into the engine's values.

Ollama's server ignores fields it does not know, and so does Serge here (they are
listed at debug level), so any Ollama client can talk to it; fields that would
change the answer and that Serge cannot honour (`template`) are a 400 naming them;
`images` go to a model that sees images (base64, checked by `serge.engine.read_image`).
`options` go through `OLLAMA_OPTIONS`, the map beside `SamplingParams`; `format`
becomes a `ResponseFormat`, `tools` the engine's `Tools`, `messages` its `Message`s.
Model names: Ollama's `name:tag` spelling maps onto library names by one rule
(`library_name`, `ollama_name`). This module formats no replies.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import (MAX_IMAGES, MAX_STOP_STRINGS, OLLAMA_OPTIONS, Engine, Message, ModelNotFound, ResponseFormat,
                          SamplingParams, Tool, ToolCall, Tools)
from serge.web.http.dialects import TOOL_TEXT, refused_settings
from serge.web.http.errors import ApiError
from serge.web.http.file_parts import image

log = logging.getLogger(__name__)

MAX_MESSAGES_PER_REQUEST = 500
MAX_TOOLS = 128
MAX_OPTIONS = 64
MAX_CONTEXT_IDS = 200_000  # the deprecated `context` of /api/generate: accepted, ignored, bounded
NO_EFFECT = "Accepted for compatibility with Ollama's API; it has no effect in Serge."
TAG = "latest"  # the tag a library name without one is listed under
HUB_PREFIXES = ("hf.co/", "huggingface.co/")  # Ollama's spelling of a Hugging Face repo
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)?")
# Ollama's own options that are no sampling setting here; accepted without effect, listed at debug level.
WITHOUT_EFFECT = ("num_keep", "typical_p", "repeat_last_n", "mirostat", "mirostat_tau", "mirostat_eta",
                  "penalize_newline", "tfs_z", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv",
                  "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread")


# What the API reference says Ollama's routes answer when they fail: Ollama's shape, {"error": "..."}.
_ERROR = {"application/json": {"schema": {"type": "object", "required": ["error"],
                                          "properties": {"error": {"type": "string"}}}}}
ERRORS_DOC = {"4XX": {"description": "The request cannot be served as sent; the message says what to change.",
                      "content": _ERROR},
              502: {"description": "A remote model's server, or the hub a pull reads, failed.", "content": _ERROR},
              503: {"description": "Busy (retry after Retry-After seconds), or the model would not load.",
                    "content": _ERROR}}


NDJSON = "application/x-ndjson"


def stream_doc(what: str) -> dict:
    """The API reference's answers of a route that streams NDJSON records, or one object with stream: false."""
    return {200: {"description": f"{what}: newline-delimited JSON records (application/x-ndjson), the last with "
                                 "done: true; one JSON object with stream: false.",
                  "content": {"application/json": {"schema": {"type": "object"}},
                              NDJSON: {"schema": {"type": "object"}}}}, **ERRORS_DOC}


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=param)


# --- names ---------------------------------------------------------------------------------
def ollama_name(name: str) -> str:
    """A library name as Ollama lists it: `name:latest` where it has no tag, else as it is."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:{TAG}"


def library_name(engine: Engine, name: str | None) -> str:
    """The library name an Ollama model name means (the default model for none). Tried in order: the name as
    given; without a leading `hf.co/` (Ollama's spelling of a hub repo); without a trailing `:latest`.
    Raises ModelNotFound naming the name as given."""
    if not name:
        return engine.check_model(None)
    given = name.strip()
    spellings = [given]
    for prefix in HUB_PREFIXES:
        if given.lower().startswith(prefix):
            spellings.append(given[len(prefix):])
    spellings += [s[: -len(TAG) - 1] for s in spellings if s.lower().endswith(f":{TAG}")]
    try:
        return engine.check_model(given)
    except ModelNotFound as missing:
        for spelling in spellings[1:]:
            try:
                return engine.check_model(spelling)
            except ModelNotFound:
                pass
        raise missing from None


def pull_spec(name: str) -> str:
    """What the library pulls for an Ollama `/api/pull` name: a catalog name or a hub repo, without `hf.co/`
    and without `:latest`."""
    spec = name.strip()
    for prefix in HUB_PREFIXES:
        if spec.lower().startswith(prefix):
            spec = spec[len(prefix):]
    return spec[: -len(TAG) - 1] if spec.lower().endswith(f":{TAG}") else spec


def keep_alive_zero(value: float | str | None) -> bool:
    """Does `keep_alive` ask to unload the model after this request (0, "0", "0s", "0m")? Other durations, and
    negative ones (keep loaded), are accepted without effect: Serge unloads by its memory budget."""
    if value is None or isinstance(value, (int, float)):
        return value == 0
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise _bad(f"keep_alive {value[:40]!r} is not a duration: a number of seconds, or e.g. '5m', '1h', '0'",
                   "keep_alive")
    return float(match[1]) == 0


# --- requests --------------------------------------------------------------------------------
class _Open(BaseModel):
    """Unknown fields are ignored, as Ollama's server ignores them; `ignored()` names them for the debug log."""

    model_config = ConfigDict(extra="allow")

    def ignored(self, where: str) -> None:
        if self.model_extra:
            log.debug("Ollama %s: ignored the fields %s", where, ", ".join(sorted(self.model_extra)))


class OllamaFunctionCall(_Open):
    name: str = Field(max_length=64)
    arguments: dict[str, Any] | str = Field(default_factory=dict, description="An object (as Ollama sends it), "
                                                                              "or JSON text.")
    index: int | None = Field(None, description=NO_EFFECT)


class OllamaToolCall(_Open):
    id: str | None = Field(None, max_length=256, description="Made up (call_<message>_<n>) when left out.")
    type: Literal["function"] | None = None
    function: OllamaFunctionCall


class OllamaMessage(_Open):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)
    images: list[str] | None = Field(None, max_length=MAX_IMAGES, description="A user's images, base64, for a "
                                                                           "model that sees images (else 400).")
    tool_calls: list[OllamaToolCall] | None = Field(None, max_length=MAX_TOOLS, description="An assistant's calls.")
    tool_name: str | None = Field(None, max_length=64, description="A tool message: the function that answered.")
    tool_call_id: str | None = Field(None, max_length=256, description="A tool message: the call it answers "
                                                                       "(else the earliest unanswered call).")
    thinking: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description=NO_EFFECT)


class OllamaFunction(_Open):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, description=TOOL_TEXT)
    parameters: dict | None = Field(None, description="The arguments' JSON schema; a call is constrained to it.")


class OllamaTool(_Open):
    type: Literal["function"] = "function"
    function: OllamaFunction


class _Generation(_Open):
    model: str | None = Field(None, max_length=200, description="name or name:tag (see the README's name rule); "
                                                                "the server's default model when left out.")
    stream: bool | None = Field(None, description="Newline-delimited JSON records (the default), or one object.")
    format: str | dict | None = Field(None, description='"json", or a JSON schema: enforced by constrained '
                                                        "decoding.")
    options: dict[str, Any] | None = Field(None, max_length=MAX_OPTIONS, description=(
        "num_predict, temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty, seed, "
        f"stop (up to {MAX_STOP_STRINGS}); num_ctx caps prompt + reply (it never grows the model's window). Others "
        "are ignored, as Ollama ignores options it does not know."))
    keep_alive: float | str | None = Field(None, description="0 unloads the model once it is idle (an admin's "
                                                             "0 always; a plain user's only where no one else "
                                                             "used the model in the last 5 minutes); other "
                                                             "durations have no effect (Serge unloads by its "
                                                             "memory budget).")
    think: bool | Literal["high", "medium", "low"] | None = Field(None, description=(
        "A model that thinks gives its thoughts in `thinking`; false asks its template not to, where it can."))
    logprobs: bool | None = Field(None, description="Return each token's log-probability.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="With logprobs: this many alternatives.")

    def sampling(self) -> tuple[SamplingParams, int | None]:
        """The options as SamplingParams, and num_ctx (None when not given)."""
        given = dict(self.options or {})
        fields: dict[str, Any] = {}
        for theirs, ours in OLLAMA_OPTIONS.items():
            value = given.pop(theirs, None)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is None or (theirs == "num_predict" and number and value <= 0) or \
                    (theirs == "seed" and number and value < 0):
                continue  # unset; num_predict -1 or -2: until the window ends; seed -1: random
            fields[ours] = value
        num_ctx = given.pop("num_ctx", None)
        if num_ctx is not None and (not isinstance(num_ctx, int) or isinstance(num_ctx, bool) or num_ctx < 1):
            raise _bad("options.num_ctx must be a positive integer", "options.num_ctx")
        if given:
            log.debug("Ollama options without effect here: %s", ", ".join(sorted(given)))
        if self.top_logprobs and not self.logprobs:
            raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
        if self.logprobs:
            fields["logprobs"] = self.top_logprobs or 0
        try:
            return SamplingParams(**fields), num_ctx
        except ValidationError as exc:
            theirs = {ours: f"options.{name}" for name, ours in OLLAMA_OPTIONS.items()} | {"logprobs": "top_logprobs"}
            raise refused_settings(exc, theirs) from None

    def response_format(self) -> ResponseFormat | None:
        if self.format in (None, ""):
            return None
        if self.format == "json":
            return ResponseFormat(type="json_object")
        if isinstance(self.format, dict):
            return ResponseFormat.model_validate({"type": "json_schema",
                                                  "json_schema": {"name": "format", "schema": self.format}})
        raise _bad(f'format is "json" or a JSON schema (an object), not {self.format[:40]!r}', "format")

    @property
    def streamed(self) -> bool:
        return self.stream is not False  # Ollama streams unless told not to


class OllamaChatRequest(_Generation):
    messages: list[OllamaMessage] | None = Field(None, max_length=MAX_MESSAGES_PER_REQUEST, description=(
        "None or empty: load the model (or unload it, with keep_alive 0) and answer at once."))
    tools: list[OllamaTool] | None = Field(None, max_length=MAX_TOOLS, description="Functions the model may call.")
    truncate: bool | None = Field(None, description="false: a conversation longer than the window is a 400 "
                                                    "instead of losing its oldest turns.")

    def conversation(self, model: str) -> list[Message]:
        out: list[Message] = []
        unanswered: list[ToolCall] = []
        for i, m in enumerate(self.messages or ()):
            m.ignored(f"messages.{i}")
            if m.images and m.role != "user":
                raise _bad(f"messages.{i}: only a user message has images", f"messages.{i}.images")
            if m.tool_calls and m.role != "assistant":
                raise _bad(f"messages.{i}: only an assistant message has tool_calls", f"messages.{i}.tool_calls")
            calls = tuple(ToolCall(c.id or f"call_{i}_{j}", c.function.name,
                                   c.function.arguments if isinstance(c.function.arguments, str)
                                   else json.dumps(c.function.arguments))
                          for j, c in enumerate(m.tool_calls or ()))
            unanswered += calls
            call_id = None
            if m.role == "tool":
                answered = next((c for c in unanswered if c.id == m.tool_call_id), None) or \
                    next((c for c in unanswered if c.name == m.tool_name), None) or \
                    (unanswered[0] if unanswered and m.tool_call_id is None else None)
                call_id = m.tool_call_id or (answered.id if answered else None)
                if answered is not None:
                    unanswered.remove(answered)
            pictures = tuple(image(b, f"messages.{i}.images.{k}") for k, b in enumerate(m.images or ()))
            out.append(Message(m.role, m.content or "", calls, call_id,
                               m.tool_name if m.role == "tool" else None, pictures))
        return out

    def tool_offer(self) -> Tools | None:
        if not self.tools:
            return None
        names = [t.function.name for t in self.tools]
        if len(set(names)) != len(names):
            raise _bad("two tools have the same name", "tools")
        return Tools(tuple(Tool(t.function.name, t.function.description or "",
                                json.dumps(t.function.parameters or {"type": "object", "properties": {}}))
                           for t in self.tools))


class OllamaGenerateRequest(_Generation):
    prompt: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description=(
        "One user message through the model's chat template; raw: true sends it as it is. None or empty (and no "
        "suffix): load the model (or unload it, with keep_alive 0) and answer at once."))
    suffix: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description="The text after the reply: "
                                                                                "fill-in-the-middle, for models "
                                                                                "with FIM tokens (else 400).")
    system: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description="A system message before it.")
    raw: bool | None = Field(None, description="Send the prompt without the chat template.")
    template: str | None = Field(None, max_length=10_000, description="Refused (400): Serge uses the model's own "
                                                                      "chat template.")
    context: list[int] | None = Field(None, max_length=MAX_CONTEXT_IDS, description="Deprecated in Ollama; "
                                                                                     + NO_EFFECT)
    images: list[str] | None = Field(None, max_length=MAX_IMAGES, description="Images, base64, for a model that "
                                                                           "sees images (not with raw or suffix).")

    def check(self, model: str) -> None:
        if self.images and (self.raw or self.suffix is not None):
            raise _bad("images go through the chat template: leave out raw and suffix to send them", "images")
        if self.template:
            raise _bad("template is not supported: Serge renders prompts with the model's own chat template "
                       "(send raw: true with a prompt you formatted yourself)", "template")

    def conversation(self) -> list[Message]:
        system = [Message("system", self.system)] if self.system else []
        pictures = tuple(image(b, f"images.{k}") for k, b in enumerate(self.images or ()))
        return [*system, Message("user", self.prompt or "", images=pictures)]


class OllamaPullRequest(_Open):
    model: str | None = Field(None, max_length=200, description="A catalog name or a hub repo (org/name, "
                                                                "org/name:QUANT, hf.co/org/name:QUANT).")
    name: str | None = Field(None, max_length=200, description="The older spelling of model.")
    stream: bool | None = Field(None, description="Progress records (the default), or one object at the end.")
    insecure: bool | None = Field(None, description=NO_EFFECT)


class OllamaModelRequest(_Open):
    """/api/show and /api/delete: one model, by `model` (or the older `name`)."""

    model: str | None = Field(None, max_length=200)
    name: str | None = Field(None, max_length=200, description="The older spelling of model.")
    verbose: bool | None = Field(None, description=NO_EFFECT)

    @property
    def named(self) -> str:
        if not (self.model or self.name):
            raise _bad("model is required", "model")
        return self.model or self.name


class OllamaEmbedRequest(_Open):
    """/api/embed: one vector per text, from an embedding model."""

    model: str | None = Field(None, max_length=200, description="An embedding model; the default one when left out.")
    input: str | list[str] = Field(description="A text or a list of texts (at most 2048).")
    truncate: bool | None = Field(None, description="false: a text longer than the model's window is a 400 "
                                                    "instead of being cut to it.")
    dimensions: int | None = Field(None, ge=1, description="Only the model's own vector length.")
    keep_alive: str | int | float | None = Field(None, description=NO_EFFECT)
    options: dict | None = Field(None, description=NO_EFFECT)


class OllamaEmbeddingsRequest(_Open):
    """/api/embeddings, the older spelling: one text in `prompt`."""

    model: str | None = Field(None, max_length=200)
    prompt: str = Field(max_length=MAX_MESSAGE_CHARS)
    keep_alive: str | int | float | None = Field(None, description=NO_EFFECT)
    options: dict | None = Field(None, description=NO_EFFECT)
