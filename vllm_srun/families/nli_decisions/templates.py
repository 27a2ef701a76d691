"""How a question becomes NLI hypotheses, and how entailment scores become probabilities.

Each pair is (the state's text, a hypothesis from the templates below, filled with the
question's instructions and one option's description). A pair's score is
`s = logit[entailment] - logit[contradiction]`: choice and score take softmax(s) over their
options; noul sigmoid(s_true) (or sigmoid(s_true - s_false) with a false side described); a
set sigmoid(s_label) per label, equal to asking each label as a noul. Templates are plain
`str.format` strings, so a subclass may override any of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_srun.plugins.decision_bodies import Question
from vllm_srun.plugins.vectors import sigmoid, softmax

# "{instructions}" is the question as asked; "{description}" is one option's description.
OPTION_TEMPLATE = "{instructions} Answer: {description}."
# The description of a noul question's true side when the request gives none.
NOUL_TRUE = "yes"


def _fill(template: str, instructions: str, description: str) -> str:
    # A description that already ends a sentence must not get a second full stop.
    text = template.format(instructions=instructions.strip(), description=description.strip())
    return text[:-1] if text.endswith(("..", "?.", "!.")) else text


def hypotheses(question: Question, *, template: str = OPTION_TEMPLATE) -> list[str]:
    """The hypotheses of `question`, in the order `probabilities` reads their scores."""
    if question.type == "noul":
        true, false = question.options
        sides = [_fill(template, question.instructions, true.description or NOUL_TRUE)]
        if "false" in question.described:
            sides.append(_fill(template, question.instructions, false.description))
        return sides
    return [_fill(template, question.instructions, option.description) for option in question.options]


def entailment_scores(logits: Sequence[np.ndarray], entailment: int, contradiction: int) -> np.ndarray:
    """Per pair: logit[entailment] - logit[contradiction]."""
    rows = np.stack([np.asarray(row, dtype=np.float64).reshape(-1) for row in logits])
    out: np.ndarray = rows[:, entailment] - rows[:, contradiction]
    return out


def probabilities(question: Question, scores: np.ndarray) -> np.ndarray:
    """One probability per `question.options` from the pairs' entailment scores."""
    if question.type == "noul":
        margin = scores[0] - scores[1] if scores.size > 1 else scores[0]
        p_true = float(sigmoid(np.asarray(margin)))
        return np.array([p_true, 1.0 - p_true])
    if question.type == "set":
        # Label by label, as a noul's one score is read, so the two agree to the last bit.
        return np.array([float(sigmoid(np.asarray(s))) for s in scores])
    return softmax(scores)
