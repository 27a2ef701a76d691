"""Pieces every surface's bodies share: the request `options`, and the error of one item.

They sit apart from the surfaces' own bodies so that each surface module (`surfaces`,
`decision_surface`) can import them, and `surfaces` can import every surface's request
type to describe it, without an import cycle.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Overflow = Literal["reject", "truncate", "window"]
TruncationDirection = Literal["right", "left"]


class WindowOptions(msgspec.Struct, forbid_unknown_fields=True):
    tokens: Annotated[int, msgspec.Meta(ge=2)]
    overlap: Annotated[int, msgspec.Meta(ge=0)] = 0


class Options(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Options every surface takes; a family ignores those that do not apply to it.

    `overflow` left out (None) means the server's default for a long input: truncation under
    `serve --auto-truncate`, else `reject` (a 400 on OpenAI-shaped embeddings, the item's own
    error elsewhere). `truncation_direction` says which end `truncate` cuts: "left" keeps a
    text's last tokens (TEI's `truncation_direction: Left`). `normalize` (embeddings) left out
    follows the package; `false` answers the vector before a trailing Normalize module (TEI's
    `normalize: false`), `true` a unit vector whatever the package says. `return_logits`
    (classify) adds each sequence result's raw logits, which probabilities fix only up to a
    constant (TEI's `raw_scores`).
    """

    return_meta: bool = False
    overflow: Overflow | None = None
    truncation_direction: TruncationDirection = "right"
    window: WindowOptions | None = None
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    return_tokens: bool = False
    head: str | None = None
    deadline_ms: Annotated[int, msgspec.Meta(gt=0)] | None = None
    normalize: bool | None = None
    return_logits: bool = False

    @property
    def overflow_mode(self) -> Overflow:
        """The long-input policy in force: `reject` when the request names none."""
        return self.overflow or "reject"


class ErrorBody(msgspec.Struct):
    """Why one input (or question) failed, in place of its result: `{code, message}`."""

    code: str
    message: str
