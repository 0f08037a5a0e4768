"""vLLM's embedding cases (tests/entrypoints/openai/embedding_tests/test_embedding.py) against Serge's
/v1/embeddings with all-MiniLM-L6-v2 (vLLM's are multilingual-e5-small's, also 384 numbers a vector); each
docstring names the case it carries. vLLM compares its vectors with sentence-transformers' own: Serge's are
compared with them in tests/test_embeddings.py, so here a text's vector is checked against itself alone."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from .conftest import EMBEDDING_MODEL

pytestmark = pytest.mark.real_model

DIMENSIONS = 384


def embed(client, texts, **kwargs):
    return client.embeddings.create(model=EMBEDDING_MODEL, input=texts, **kwargs)


def test_one_text_or_one_list_of_ids_gives_one_vector_and_counts_its_tokens(client):
    """test_single_embedding (vLLM checks e5's 11 tokens for the text; here the count is the ids' and a text's
    is more than none; and OpenAI's usage, which has no completion_tokens)"""
    reply = embed(client, ["The chef prepared a delicious meal."], encoding_format="float")
    assert len(reply.data) == 1 and len(reply.data[0].embedding) == DIMENSIONS
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 0
    reply = embed(client, [1, 1, 1, 1, 1], encoding_format="float")
    assert len(reply.data) == 1 and len(reply.data[0].embedding) == DIMENSIONS
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == 5


def test_a_batch_gives_a_vector_each_in_order_and_counts_every_token(client):
    """test_batch_embedding (its token counts for the id lists; for the texts, each text's vector is the one it
    gets alone, where vLLM compares with sentence-transformers')"""
    texts = ["The cat sat on the mat.", "A feline was resting on a rug.", "Stars twinkle brightly in the night sky."]
    reply = embed(client, texts, encoding_format="float")
    assert [d.index for d in reply.data] == [0, 1, 2] and all(len(d.embedding) == DIMENSIONS for d in reply.data)
    alone = embed(client, texts[1:2], encoding_format="float").data[0].embedding
    assert np.allclose(reply.data[1].embedding, alone, atol=1e-5)
    ids = [[4, 5, 7, 9, 20], [15, 29, 499], [24, 24, 24, 24, 24], [25, 32, 64, 77]]
    reply = embed(client, ids, encoding_format="float")
    assert len(reply.data) == 4 and all(len(d.embedding) == DIMENSIONS for d in reply.data)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == 17


def test_base64_vectors_are_the_float_ones(client):
    """test_batch_base64_embedding"""
    texts = ["Hello my name is", "The best thing about vLLM is that it supports many different models"]
    floats = [d.embedding for d in embed(client, texts, encoding_format="float").data]
    packed = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4").tolist()
              for d in embed(client, texts, encoding_format="base64").data]
    default = [d.embedding for d in embed(client, texts).data]  # the openai client asks base64 and decodes it
    assert np.allclose(floats, packed, atol=1e-6) and np.allclose(floats, default, atol=1e-6)
