"""What a chat template makes of messages' contents: the string constants it could find there, and the text it puts
around contents it takes as they are (its skeleton), which a content holding no constant is spliced into."""

from dataclasses import dataclass

import jinja2
import jinja2.nodes

SENTINELS = (" \n\x02A{}\x03\t ", "\t\x02b{}\x03 \n")
"""Stand-ins for message contents, two families: a template that renders each unchanged wherever it puts a content
(no trim, no case change, no test of the text) has a skeleton the contents can be spliced into."""


@dataclass(frozen=True)
class Skeleton:
    """The rendered prompt's text around each message's content, in order (`parts`), its UTF-8 size and the sum of
    its bytes' pair-bound weights (`PairBound.spoilt`; 0 without a bound)."""

    parts: tuple[str, ...]
    size: int
    spoilt: int

    def splice(self, contents: list[str]) -> str:
        spliced = [*self.parts, *contents]
        spliced[::2], spliced[1::2] = self.parts, contents
        return "".join(spliced)


def skeleton_parts(template: jinja2.Template, roles: tuple[str, ...]) -> tuple[str, ...] | None:
    """The text around each content when `template` puts every content of messages of `roles` in unchanged, in order
    (rendered with two families of stand-ins, which must leave the same text around them); None otherwise."""
    found: list[list[str]] = []
    for family in SENTINELS:
        stand_ins = [family.format(index) for index in range(len(roles))]
        messages = [{"role": role, "content": stand_in} for role, stand_in in zip(roles, stand_ins, strict=True)]
        try:
            rendered = str(template.render({"messages": messages, "add_generation_prompt": True}))
        except jinja2.TemplateError:
            return None
        pieces: list[str] = []
        for stand_in in stand_ins:
            before, found_it, rendered = rendered.partition(stand_in)
            if not found_it or stand_in in rendered:
                return None
            pieces.append(before)
        found.append([*pieces, rendered])
    return tuple(found[0]) if found[0] == found[1] else None


def holds_any(text: str, constants_by_first: dict[str, tuple[str, ...]]) -> bool:
    """`text` holds one of the constants (grouped by their first character: a text without it holds none of them)."""
    for first, constants in constants_by_first.items():
        if first in text:
            for constant in constants:
                if constant in text:
                    return True
    return False


def template_constants(parsed: jinja2.nodes.Template) -> tuple[str, ...]:
    """The string constants (two characters or more) a content holding one may make the template act on: not a
    key (message['role'] reads no text) nor what it only compares with a role (`_compared_with_roles`)."""
    keys = {id(node.arg) for node in parsed.find_all(jinja2.nodes.Getitem)} | _compared_with_roles(parsed)
    found = {node.value for node in parsed.find_all(jinja2.nodes.Const)
             if isinstance(node.value, str) and len(node.value) >= 2 and id(node) not in keys}
    # A content holding a longer constant holds each shorter one inside it: the shorter ones alone are looked for.
    return tuple(sorted(c for c in found if not any(other != c and other in c for other in found)))


def _compared_with_roles(parsed: jinja2.nodes.Template) -> set[int]:
    """The constants a template only compares with a role (`x['role'] == 'c'`, `x.role != 'c'`): what a content
    holds cannot change such a comparison (the roles are each skeleton's own)."""
    compared: set[int] = set()
    for node in parsed.find_all(jinja2.nodes.Compare):
        if len(node.ops) == 1:
            left, right = node.expr, node.ops[0].expr
            for one, other in ((left, right), (right, left)):
                if isinstance(other, jinja2.nodes.Const) and _reads_role(one):
                    compared.add(id(other))
    return compared


def _reads_role(node: jinja2.nodes.Node) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "role"
    return isinstance(node, jinja2.nodes.Getattr) and node.attr == "role"
