"""MkDocs hook (mkdocs.yml `hooks:`): writes the option reference into docs/options.md while the
site builds, from GRPOConfig itself: each field's default as `groupwise train --help` prints it
and its meaning from its comment in src/groupwise/config/grpo_config.py (`config.option_help`),
grouped by the config's `# --- section ---` rules. On docs/trl.md it writes the deliberate
differences from TRL's GRPOConfig (`config.trl_parity.DIFFERENCES`) and the number of TRL
names accepted and ignored (`config.trl.TRL_IGNORED`). Nothing generated is committed, so it
cannot drift."""

from __future__ import annotations

import inspect
import re
from typing import Any

MARKER = "<!-- option reference: generated from GRPOConfig while the site builds -->"
DIFFERENCES_MARKER = "<!-- differences from TRL: generated from config/trl_parity.py -->"
IGNORED_COUNT_MARKER = "<!-- the number of names in groupwise.config.trl.TRL_IGNORED -->"
SECTION_RULE = re.compile(r"^    # -{3}\s*(?P<title>[^-].*?)\s*-*\s*$")
FIELD_LINE = re.compile(r"^    (?P<name>\w+): ")


def option_sections() -> list[tuple[str, list[str]]]:
    """(section title, field names in source order) as grpo_config.py's section rules group them."""
    from groupwise.config.grpo_config import GRPOConfig

    names = set(GRPOConfig.field_names())
    sections: list[tuple[str, list[str]]] = []
    for line in inspect.getsource(GRPOConfig).splitlines():
        rule = SECTION_RULE.match(line)
        if rule:
            sections.append((rule["title"], []))
            continue
        field = FIELD_LINE.match(line)
        if field and field["name"] in names:
            if not sections:
                sections.append(("options", []))
            sections[-1][1].append(field["name"])
    return [(title, fields) for title, fields in sections if fields]


def _cell(text: str) -> str:
    # A "|" inside a cell would end it; a newline would end the row.
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value!r}`"


def option_reference() -> str:
    """The reference as Markdown: one heading and one table (option, default, meaning) per
    section of GRPOConfig."""
    from groupwise.config.grpo_config import GRPOConfig, option_help

    defaults = GRPOConfig.field_defaults()
    meanings = option_help()
    parts = []
    for title, fields in option_sections():
        # "curriculum (Multi-Adversary GDRO, ...)": the heading, then what the brackets say.
        name, _, note = title.partition(" (")
        heading = f"## {name[0].upper()}{name[1:]}\n\n" + (f"({note}\n\n" if note else "")
        rows = [
            f"| `{name}` | {_cell(_default(defaults[name]))} | {_cell(meanings[name])} |"
            for name in fields
        ]
        parts.append(
            f"{heading}| option | default | meaning |\n|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def differences_table() -> str:
    """The deliberate differences from TRL's GRPOConfig as a Markdown table (option,
    groupwise, TRL, why), in the list's order."""
    from groupwise.config.trl_parity import DIFFERENCES, TRL_VERSION

    rows = [
        f"| `{name}` | {_cell(d.groupwise)} | {_cell(d.trl)} | {_cell(d.reason)} |"
        for name, d in DIFFERENCES.items()
    ]
    header = f"| option | groupwise | TRL {TRL_VERSION} | why |\n|---|---|---|---|\n"
    return header + "\n".join(rows) + "\n"


def trl_page(markdown: str) -> str:
    """docs/trl.md with its generated parts written in."""
    from groupwise.config.trl import TRL_IGNORED

    markdown = markdown.replace(IGNORED_COUNT_MARKER, str(len(TRL_IGNORED)))
    return markdown.replace(DIFFERENCES_MARKER, differences_table())


DOCS_PAGE = re.compile(r"\bdocs/(?P<page>[\w-]+)\.md\b")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if DIFFERENCES_MARKER in markdown:
        markdown = trl_page(markdown)
    if MARKER not in markdown:
        return markdown
    # The comments name pages as docs/x.md (they are read in the source too); on the site that
    # is a link, which the strict build checks. The div lets docs/css/extra.css style the tables.
    reference = DOCS_PAGE.sub(r"[\g<page>](\g<page>.md)", option_reference())
    wrapped = f'<div class="option-reference" markdown>\n\n{reference}\n</div>'
    return markdown.replace(MARKER, wrapped)
