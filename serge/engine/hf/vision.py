"""A vision model's images as the transformers engine feeds them: each image's placeholder in the prompt
expanded as the model's processor expands it, and the pixel inputs for the prompt's first pass.

The chat template marks each image with one placeholder token, and the prompt is
built and trimmed with that one token (`build_prompt`); here, after trimming,
each placeholder left becomes the processor's run of image tokens (a LLaVA
model's `<image>` times its patches, SmolVLM's tiles with their markers) and the
images whose turns were kept become pixel values. Nothing here is kept on the
model: the inputs go with the request to the scheduler, which feeds them with
the prompt's first prefill pass and never caches that prompt's keys and values
(two images share the same placeholder ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch  # extra: transformers

from serge.engine.generation.prompting.images import Image

# Where a processor's outputs are the model's inputs besides the token ids (pixel_values, image_sizes, ...).
_NOT_MODEL_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


def image_token_id(processor) -> int:
    token = getattr(processor, "image_token", None)
    if token is None:
        raise ValueError(f"{type(processor).__name__} names no image token")
    return processor.tokenizer.convert_tokens_to_ids(token)


def image_inputs(processor, ids: list[int], images: Sequence[Image]) -> tuple[list[int], dict | None]:
    """`ids` with each image placeholder expanded, and the pixel inputs of the images still in it (trimming
    drops the oldest turns, so the last ones); (ids, None) when no image is left."""
    placeholder = image_token_id(processor)
    at = [i for i, token in enumerate(ids) if token == placeholder]
    if not at:
        return ids, None
    pictures = [image.pil() for image in images[len(images) - len(at):]]
    token = processor.image_token
    out: list[int] = []
    last = 0
    for i, picture in zip(at, pictures):
        one = processor(text=token, images=[picture], add_special_tokens=False, return_tensors="pt")
        out += ids[last:i] + one["input_ids"][0].tolist()
        last = i + 1
    out += ids[last:]
    every = processor(text=token * len(pictures), images=pictures, add_special_tokens=False, return_tensors="pt")
    return out, {k: v for k, v in every.items() if k not in _NOT_MODEL_INPUTS}


def on_device(inputs: dict, model) -> dict:
    """The pixel inputs where the model is, floating ones in its dtype."""
    return {k: (v.to(model.device, model.dtype) if v.is_floating_point() else v.to(model.device))
            if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
