"""An image in a conversation: its bytes, checked once to be a real image of bounded size.

An image comes inside a request (base64, a data: URL), never as a path or a URL
Serge would fetch. It is checked here, before any model sees it: the bytes are
counted, the header's width and height are bounded before a pixel is decoded
(so a small file that claims to be huge is refused cheaply), and the pixels are
then decoded in full, so a file that lies about its size (truncated, corrupt)
is refused rather than half-read. Pillow's own decompression-bomb guard stays on
beneath these limits.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from serge.engine.generation.constraints.schemas import InvalidRequest

MAX_IMAGE_BYTES = 10 * 2**20  # one image's encoded bytes
MAX_IMAGE_PIXELS = 4096 * 4096  # one image's width x height (Pillow's own bomb guard is 89 million)
MAX_IMAGES = 16  # images in one request
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp", "BMP": "image/bmp"}


class ImageRefused(InvalidRequest):
    """Not an image Serge will show a model: not an image, of a format it does not read, or broken."""

    def __init__(self, message: str, param: str = "image") -> None:
        super().__init__(message, param)


class ImageTooLarge(ImageRefused):
    """Past a limit on bytes, pixels or count; the message names it."""


@dataclass(frozen=True)
class Image:
    """A checked image; `data` is its encoded bytes, as the client sent them."""

    data: bytes = field(repr=False)
    media_type: str
    width: int
    height: int

    def pil(self):
        """The pixels as RGB, for a processor (decoded again: nothing decoded is kept on the message)."""
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(self.data)) as img:
            return img.convert("RGB")


def read_image(raw: bytes, param: str = "image") -> Image:
    """Check `raw` is an image within the limits; ImageRefused (or ImageTooLarge) naming `param` otherwise."""
    from PIL import Image as PILImage, UnidentifiedImageError

    if len(raw) > MAX_IMAGE_BYTES:
        raise ImageTooLarge(f"{param}: the image is {len(raw)} bytes; the limit is {MAX_IMAGE_BYTES} bytes "
                            f"({MAX_IMAGE_BYTES // 2**20} MiB)", param)
    try:
        with PILImage.open(io.BytesIO(raw)) as img:
            width, height, kind = img.width, img.height, img.format
            if width * height > MAX_IMAGE_PIXELS or not width or not height:
                raise ImageTooLarge(f"{param}: the image says it is {width}x{height} pixels; the limit is "
                                    f"{MAX_IMAGE_PIXELS} pixels (4096x4096)", param)
            if kind not in FORMATS:
                raise ImageRefused(f"{param}: {kind} images are not taken; send PNG, JPEG, GIF, WebP or BMP", param)
            img.load()  # every pixel: a file shorter than its header says fails here
    except ImageRefused:
        raise
    except PILImage.DecompressionBombError:
        raise ImageTooLarge(f"{param}: the image would decode to more pixels than Serge takes "
                            f"({MAX_IMAGE_PIXELS})", param) from None
    except UnidentifiedImageError:
        raise ImageRefused(f"{param}: the data is not an image Serge can read (PNG, JPEG, GIF, WebP or BMP)",
                           param) from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated, corrupt, or lying about its size
        raise ImageRefused(f"{param}: the image is broken or shorter than its header says ({exc}); send the "
                           f"whole file", param) from None
    return Image(raw, FORMATS[kind], width, height)
