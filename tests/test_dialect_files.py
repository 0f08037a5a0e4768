"""Files inside the dialects' own messages (OpenAI's file part, Anthropic's document block, the Responses API's
input_file): their text reaches the model, named; a file named by address is a 400, as Serge fetches nothing."""

from __future__ import annotations

import base64

import documents as files
from test_chat_documents import asked_text, client, data_dir, recorder  # noqa: F401  (fixtures)

PDF = base64.b64encode(files.report_pdf()).decode()
ASK = {"type": "text", "text": "Who keeps the lighthouse?"}


def test_an_openai_file_part_reaches_the_model_named(client, recorder):
    part = {"type": "file", "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [part, ASK]}],
                                                      "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    prompt = " ".join(asked_text(recorder).split())
    assert '<file name="report.pdf">' in prompt and files.PAGE_THREE_FACT in prompt and "[page 3]" in prompt


def test_an_anthropic_document_block_reaches_the_model_named(client, recorder):
    blocks = [{"type": "document", "title": "report", "source": {"type": "base64", "media_type": "application/pdf",
                                                                 "data": PDF}},
              {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Tide at noon."}},
              ASK]
    reply = client.post("/v1/messages", json={"model": "standin", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": blocks}]})
    assert reply.status_code == 200, reply.text
    prompt = " ".join(asked_text(recorder).split())
    assert '<file name="report.pdf">' in prompt and files.PAGE_THREE_FACT in prompt and "Tide at noon." in prompt


def test_a_responses_input_file_reaches_the_model_named(client, recorder):
    part = {"type": "input_file", "filename": "notes.md", "file_data": base64.b64encode(b"# Ferry at nine").decode()}
    reply = client.post("/v1/responses", json={"model": "standin", "max_output_tokens": 4, "store": False, "input": [
        {"role": "user", "content": [part, {"type": "input_text", "text": "When is the ferry?"}]}]})
    assert reply.status_code == 200, reply.text
    assert '<file name="notes.md">\n# Ferry at nine' in asked_text(recorder)


def test_a_file_named_by_address_is_refused_and_nothing_is_fetched(client):
    openai_url = {"type": "file", "file": {"file_data": "https://example.com/a.pdf"}}
    openai_id = {"type": "file", "file": {"file_id": "file-abc"}}
    for part in (openai_url, openai_id):
        reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}]})
        assert reply.status_code == 400 and "never fetches" in reply.json()["error"]["message"]
    url = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    reply = client.post("/v1/messages", json={"model": "standin", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": [url]}]})
    assert reply.status_code == 400 and "never fetches" in reply.json()["error"]["message"]
    remote = {"type": "input_file", "file_url": "https://example.com/a.pdf"}
    reply = client.post("/v1/responses", json={"model": "standin", "input": [{"role": "user", "content": [remote]}]})
    assert reply.status_code == 400 and "never fetches" in reply.json()["error"]["message"]


def test_a_hostile_file_in_a_dialect_is_a_4xx_in_its_shape(client):
    locked = base64.b64encode(files.encrypted_pdf()).decode()
    block = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": locked}}
    reply = client.post("/v1/messages", json={"model": "standin", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": [block]}]})
    assert reply.status_code == 422 and "encrypted" in reply.json()["error"]["message"]
    assert reply.json()["type"] == "error"  # Anthropic's shape
    bad = {"type": "file", "file": {"filename": "x.pdf", "file_data": "not base64!"}}
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [bad]}]})
    assert reply.status_code == 400 and "base64" in reply.json()["error"]["message"]
