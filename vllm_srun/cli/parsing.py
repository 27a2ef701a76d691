"""The argparse parser every `vllm-srun` command is built on.

No option may be abbreviated (`--max-num-seq` is refused, not taken as `--max-num-seqs`); an
unknown option is refused by the subcommand it was given to, with its usage and the nearest
option it has; --help shows each option's default and the environment variable it reads.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """Help lines ending in `[default: X]` (where there is one) and `[env: NAME]` (see `reads`)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=100)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        env = getattr(action, "env", None)
        shown = getattr(action, "shown_default", action.default)
        if callable(shown):  # computed only when help is shown (it may import the queue)
            shown = shown()
        if env is not None:  # its default is the variable's value: a secret is never printed
            return f"{text} [env: {env}]"
        # A key given by other means than an environment variable is not printed either.
        secret = bool({"key", "password", "token", "secret"} & set(action.dest.split("_")))
        if (
            action.option_strings
            and not secret
            and shown not in (None, False, argparse.SUPPRESS)
            and "%(default)" not in text
        ):
            text += f" [default: {str(shown).replace('%', '%%')}]"
        return text


def reads(action: argparse.Action, env: str) -> argparse.Action:
    """Mark `action` as reading environment variable(s) `env` (its default comes from there)."""
    action.env = env  # type: ignore[attr-defined]
    return action


def shows(action: argparse.Action, default: Any | Callable[[], Any]) -> argparse.Action:
    """Show `default` in help for an option whose default is decided elsewhere (None here)."""
    action.shown_default = default  # type: ignore[attr-defined]
    return action


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations, with `HelpFormatter`, refusing unknown options in the
    words of the subcommand they were given to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser = self.chosen(parsed)
            parser.error(unrecognized(parser, unknown))
        return parsed

    def chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that `parsed` went through (this one if none)."""
        parser: argparse.ArgumentParser = self
        while True:
            subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(parsed, subcommands[0].dest, None) if subcommands else None
            if name is None or name not in subcommands[0].choices:
                return parser
            parser = subcommands[0].choices[name]


def unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """argparse's message, with the option `parser` has nearest to the first unknown one."""
    message = f"unrecognized arguments: {' '.join(unknown)}"
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    for given in unknown:
        if given.startswith("-"):
            near = difflib.get_close_matches(given.partition("=")[0], options, n=1, cutoff=0.6)
            if near:
                return f"{message} (did you mean {near[0]}?)"
    return message
