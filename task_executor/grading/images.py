"""Refusing work meant for another task image, before any of it is done.

An executor runs one image (``--image``) or none (the host's root). A spec naming another image,
or naming one where none runs, or naming none where one runs, would run in an environment its
caller did not ask for: it is answered 421 (Misdirected Request), so a pool sends it elsewhere.
"""

from __future__ import annotations

from task_executor.errors import ExecutorError


class ImageMismatch(ExecutorError):
    """The spec's image is not the one this executor runs."""

    code = "image_mismatch"
    http_status = 421


def expect_image(running: str | None, requested: str | None) -> None:
    """Raise ImageMismatch unless ``requested`` is exactly the image this executor is ``running``
    (both None: the host's root, as asked)."""
    if requested == running:
        return
    asked = f"image {requested!r}" if requested is not None else "no image (the host's root)"
    here = f"runs image {running!r}" if running is not None else "runs no image (the host's root)"
    raise ImageMismatch(f"the spec asks for {asked} but this executor {here}; send it to an "
                        "executor of that image")
