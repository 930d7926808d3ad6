"""What a chat template may act on in a message's content: the string constants it could find there (a content
holding none is put into the prompt as the template's skeleton says, `tokenizer.ModelTokenizer._spliced`)."""

import jinja2.nodes


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
