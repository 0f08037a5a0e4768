"""A random-weight vision-language model made in the test from LLaVA's real architecture (CLIP vision tower,
projector, Llama text model) at tiny sizes, saved with a processor: no download, no real model's weights.

The text side's tokenizer is the bundled model's (its tokenizer files only), with an `<image>` token added;
the chat template is ChatML that marks each image part with that token. Images of `SIDE` pixels become
`IMAGE_TOKENS` tokens.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

NAME = "tiny-vlm"
SIDE = 28  # the vision tower's image size: 2x2 patches of 14
IMAGE_TOKENS = 4  # patches per image (LLaVA's "default" strategy drops CLIP's class token)
TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
            "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build(folder: Path, tokenizer_folder: Path) -> Path:
    import torch
    from transformers import (AutoTokenizer, CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=SIDE, patch_size=14)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=2048,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(
        "<image>"), vision_feature_layer=-1, vision_feature_select_strategy="default")
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    images = CLIPImageProcessorPil(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})
    LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14, num_additional_image_tokens=1,
                   vision_feature_select_strategy="default", chat_template=TEMPLATE).save_pretrained(folder)
    return folder


def png(color: str | tuple, size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"
