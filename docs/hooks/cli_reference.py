"""MkDocs hook: the command-line reference, rendered from ``twinflow.cli.build_parser()``.

The line ``<!-- cli-reference -->`` in reference/cli.md becomes, for the
``twinflow`` command and each of its subcommands in the parser's order, its
usage and a table of its arguments (name, default, meaning), taken from the
argparse parser the command itself uses. Nothing generated is kept in the
repository: a flag added to the parser appears on the next build.
"""

from __future__ import annotations

import argparse
import logging
import os

log = logging.getLogger("mkdocs.hooks.cli_reference")

MARKER = "<!-- cli-reference -->"


def _cell(text) -> str:
    text = str(text).replace("``", "`").replace("|", "\\|").replace("\n", " ")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _name(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    flags = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                 else action.dest.upper())
    return f"{flags} `{metavar}`"


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if "(default" in (action.help or ""):
        return ""  # the meaning says it in words (e.g. "one per CPU", which a value from this machine is not)
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _meaning(action: argparse.Action) -> str:
    parts = [action.help or ""]
    if action.choices and not action.option_strings:
        parts.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if isinstance(action, argparse._AppendAction):
        parts.append("(repeatable)" if "repeatable" not in (action.help or "") else "")
    return _cell(" ".join(p for p in parts if p).strip())


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions  # hidden ones are old names kept for a while
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
                   and a.help != argparse.SUPPRESS]
        if not actions:
            continue
        title = {"positional arguments": "Arguments", "options": "Options"}.get(group.title, group.title)
        out += [f"**{_cell(title)}**", "", "| argument | default | meaning |", "|---|---|---|"]
        out += [f"| {_name(a)} | {_default(a)} | {_meaning(a)} |" for a in actions]
        out.append("")
    return out


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().strip()
    return ["```text", usage[len("usage: "):] if usage.startswith("usage: ") else usage, "```", ""]


def render() -> str:
    from twinflow.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal's width: the same on every build
    try:
        return _render(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _render(parser: argparse.ArgumentParser) -> str:
    out = ["## `twinflow`", "", _cell(parser.description or ""), "", *_usage(parser), *_arguments(parser)]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subparsers._choices_actions}
    for name, sub in subparsers.choices.items():
        out += [f"## `twinflow {name}`", "", _cell(helps.get(name) or ""), "", *_usage(sub), *_arguments(sub)]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    try:
        text = render()
    except Exception as exc:  # reported, so that a strict build fails and says why
        log.warning("%s: the CLI reference could not be rendered from twinflow.cli: %s: %s",
                    page.file.src_uri, type(exc).__name__, exc)
        return markdown
    return markdown.replace(MARKER, text)
