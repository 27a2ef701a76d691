"""The questions the NLI family defines (`preset` in a request; `presets` on its model card).

Each is a raw question, read exactly as the same question written out in a request would be,
so a preset's answer equals the explicit question's. A request may add only `threshold` (set
presets) and `over` to one. Presets: `domain` (choice), `needs_reasoning` (noul), `difficulty`
(score, level 0 trivial to 4 expert), `topics` (set).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "domain": {
        "type": "choice",
        "instructions": "Which domain does this request belong to?",
        "criteria": {
            "code": "programming and software",
            "math": "mathematics",
            "science": "natural science",
            "business": "business and finance",
            "health": "health and medicine",
            "law": "law",
            "other": "something else",
        },
    },
    "needs_reasoning": {
        "type": "noul",
        "instructions": "Does answering this request need multi-step reasoning?",
        "criteria": {
            "true": "it needs several steps of reasoning",
            "false": "a direct answer is enough",
        },
    },
    "difficulty": {
        "type": "score",
        "instructions": "How difficult is this request to answer well?",
        "levels": ["trivial", "easy", "moderate", "hard", "expert"],
    },
    "topics": {
        "type": "set",
        "instructions": "Which topics does this request touch?",
        "criteria": {
            "code": "programming",
            "math": "mathematics",
            "writing": "writing or editing text",
            "data": "data analysis",
            "advice": "personal advice",
        },
    },
}
