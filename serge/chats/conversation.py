"""What a chat's reply is asked with: the branch up to its question as the engine's messages, the model and
settings the chat (or the preset it names) gives, and what of the chat's documents, knowledge collections and
preset's files goes in with the question, with the sources that shows the reply's reader. It reads and stores
nothing; `service.ChatService` starts the reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from serge.chats.documents import ChatDocuments
from serge.chats.knowledge import Knowledge
from serge.chats.presets import Presets
from serge.engine import Engine, Message, SamplingParams
from serge.store import ChatRecord, MessageRecord, PresetRecord


@dataclass
class Asked:
    """One reply's input, built from its chat."""

    history: list[Message]  # the engine's messages, the question last
    places: list[int]  # each message's place on the branch, but a system prompt's (what the engine drops, counted)
    attached: list[str]  # the documents attached on the branch up to the question
    model: str
    settings: dict  # `SamplingParams`' fields, as stored with the reply
    preset: PresetRecord | None
    collections: dict[str, str] = field(default_factory=dict)  # document id -> its collection's name, searched too
    sources: list | None = None  # what went in with the question


class Conversations:
    """A chat's replies' input, from the parts a server has (None: no files, collections or presets)."""

    def __init__(self, engine: Engine, documents: ChatDocuments | None, knowledge: Knowledge | None,
                 presets: Presets | None) -> None:
        self.engine, self.documents, self.knowledge, self.presets = engine, documents, knowledge, presets

    def branch(self, owner: str, chat: ChatRecord, question: MessageRecord
               ) -> tuple[list[Message], list[int], list[str]]:
        """The messages for the engine, where each (but the system prompt) is on the branch, and the documents
        attached on the branch up to the question (which is on `chat`'s branch)."""
        upto = []
        for m in chat.messages:
            upto.append(m)
            if m.id == question.id:
                break
        history = [Message("system", chat.system_prompt)] if chat.system_prompt else []
        places, attached = [], []
        for i, m in enumerate(upto):
            attached += m.attachments or []
            if m.role == "assistant" and not m.content:
                continue  # a reply that failed before it said anything
            # A reply's thoughts stay out: thinking templates (Qwen3's, DeepSeek-R1's) drop earlier turns' thoughts.
            images = self.documents.images(owner, m.attachments) if m.attachments and self.documents else ()
            history.append(Message(m.role, m.content, images=images))
            places.append(i)
        return history, places, attached

    def model_for(self, owner: str, chat: ChatRecord, history: list[Message]
                  ) -> tuple[str, dict, PresetRecord | None]:
        """(model, settings, preset) of the chat's replies: a preset's model, its system prompt put first in
        `history` under the chat's own, the chat's settings over its."""
        model, settings = chat.model or self.engine.default_model, chat.settings
        preset = self.presets.find(owner, chat.model) if self.presets is not None else None
        if preset is not None:
            model = self.presets.base_model(preset)
            if preset.system_prompt and not chat.system_prompt:
                history.insert(0, Message("system", preset.system_prompt))  # outside `places`, as the chat's is
            settings = self.presets.sampling(preset, SamplingParams(**chat.settings)).model_dump(
                mode="json", exclude_none=True)
        return model, settings, preset

    def asked(self, owner: str, chat: ChatRecord, question: MessageRecord) -> Asked:
        """The reply to `question`'s input: its branch and model, and before the question what the chat's and
        the question's documents and collections, and the preset's files, tell of it."""
        history, places, attached = self.branch(owner, chat, question)
        model, settings, preset = self.model_for(owner, chat, history)
        asked = Asked(history, places, attached, model, settings, preset)
        named = [*chat.knowledge, *(question.knowledge or [])]
        if named and self.knowledge is not None:  # the chat's collections and the question's, searched with the files
            in_collections, names = self.knowledge.searchable(owner, named)
            asked.collections = {d: names[c] for d, c in in_collections.items()}
        if (attached or asked.collections) and self.documents is not None:
            given = self.documents.given(owner, model, attached, history, asked.collections)
            if given.text:
                history[-1] = replace(history[-1], content=f"{given.text}\n\n{history[-1].content}")
            asked.sources = given.sources
        if preset is not None and (told := self.presets.given(preset, model, history))[0]:
            history[-1] = replace(history[-1], content=f"{told[0]}\n\n{history[-1].content}")
            asked.sources = [*(asked.sources or []), *told[1]]
        return asked
