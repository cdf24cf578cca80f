"""Write docs/config.md, the config reference, from the schema's own source.

Every section of a run config is a dataclass in a module of rlx/config/ (schema.py holds ``RunConfig``, which
includes the others). This script reads those files with ``ast`` -- it imports nothing of
rlx -- and writes, per section, a table of each key with its type, its default, its allowed values (the
``*_CHOICES`` tuples, or inline tuples, that ``check_choice`` or a ``not in (...)`` test enforces in the
section's ``__post_init__``) and its one-line docstring (the string literal after the field).

    python scripts/config_reference.py            # rewrite docs/config.md
    python scripts/config_reference.py --check    # exit 1, naming what differs, when docs/config.md is stale

It leaves out what ``__post_init__`` checks in code rather than as a list of choices (ranges, cross-field
rules): the field's docstring says those, and a wrong value's error message names the fix.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILES = tuple(sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "rlx" / "config").glob("*.py")))
TOP_CLASS = "RunConfig"
OUT = ROOT / "docs" / "config.md"
UNKNOWN = object()


@dataclass
class Key:
    name: str
    type: str
    default: str
    doc: str
    section_class: str | None = None  # the dataclass of a nested section
    choices: tuple | None = None


@dataclass
class Section:
    path: str  # "" for the top level, else e.g. "model.lora"
    doc: str
    keys: list[Key] = field(default_factory=list)


@dataclass
class Source:
    """What the schema files hold: constants, dataclasses (field nodes in order) and the enforced choices."""

    constants: dict[str, object] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    choices: dict[str, object] = field(default_factory=dict)  # "model.lora.sync" -> tuple, from check_choice
    class_choices: dict[tuple[str, str], object] = field(default_factory=dict)  # (class, field) -> tuple


def evaluate(node: ast.AST, constants: dict[str, object]) -> object:
    """The value of a literal, a named constant, or a sum of them (``("auto",) + DTYPE_CHOICES``)."""
    if isinstance(node, ast.Name):
        return constants.get(node.id, UNKNOWN)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = evaluate(node.left, constants), evaluate(node.right, constants)
        return UNKNOWN if UNKNOWN in (left, right) else left + right
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [evaluate(item, constants) for item in node.elts]
        if UNKNOWN in items:
            return UNKNOWN
        return tuple(items) if isinstance(node, ast.Tuple) else items
    try:
        return ast.literal_eval(node)
    except ValueError:
        return UNKNOWN


def read_sources(root: Path = ROOT) -> Source:
    source = Source()
    trees = [ast.parse((root / name).read_text(), filename=name) for name in SCHEMA_FILES]
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = evaluate(node.value, source.constants)
                if value is not UNKNOWN:
                    source.constants[node.targets[0].id] = value
            elif isinstance(node, ast.ClassDef) and _is_dataclass(node):
                source.classes[node.name] = node
    for tree in trees:
        _read_choices(tree, source)
    return source


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(ast.unparse(d).split("(")[0].endswith("dataclass") for d in node.decorator_list)


def _read_choices(tree: ast.Module, source: Source) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("check_choice") and len(node.args) == 3:
            where = node.args[0]
            if isinstance(where, ast.Constant) and isinstance(where.value, str):
                source.choices[where.value] = evaluate(node.args[2], source.constants)
    for cls in source.classes.values():
        for node in ast.walk(cls):
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.NotIn):
                target = node.left
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    value = evaluate(node.comparators[0], source.constants)
                    if isinstance(value, tuple):
                        source.class_choices[(cls.name, target.attr)] = value


def _fields(cls: ast.ClassDef) -> list[tuple[ast.AnnAssign, str]]:
    """The class's fields in order, each with the docstring that follows it ("" when none does)."""
    out = []
    for i, node in enumerate(cls.body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
            doc = (
                nxt.value.value
                if (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                )
                else ""
            )
            out.append((node, " ".join(inspect.cleandoc(doc).split())))
    return out


def _default(node: ast.AST | None, source: Source) -> tuple[str, str | None]:
    """(the default as shown, the dataclass name when the field is a nested section)."""
    if node is None or ast.unparse(node) == "MISSING":
        return "required", None
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "field":
        kwargs = {kw.arg: kw.value for kw in node.keywords}
        if "default" in kwargs:
            return _default(kwargs["default"], source)
        factory = kwargs.get("default_factory")
        if isinstance(factory, ast.Name) and factory.id in source.classes:
            return "", factory.id
        if isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
            return _show([] if factory.id == "list" else {}), None
        if isinstance(factory, ast.Lambda):
            value = evaluate(factory.body, source.constants)
            return (_show(value) if value is not UNKNOWN else f"`{ast.unparse(factory.body)}`"), None
    value = evaluate(node, source.constants)
    return (_show(value) if value is not UNKNOWN else f"`{ast.unparse(node)}`"), None


def _show(value: object) -> str:
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k}: {_show(v).strip('`')}" for k, v in value.items()) + "}`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(_show(v).strip("`") for v in value) + "]`"
    return f"`{value}`"


def sections(root: Path = ROOT) -> list[Section]:
    """Every section of the run config, the top level first, in the order the schema declares them."""
    source = read_sources(root)
    top = Section("", "Keys at the top level of a run config.")
    out = [top]
    _walk(source, TOP_CLASS, top, out)
    return out


def _walk(source: Source, class_name: str, section: Section, out: list[Section]) -> None:
    for node, doc in _fields(source.classes[class_name]):
        default, nested = _default(node.value, source)
        path = f"{section.path}.{node.target.id}" if section.path else node.target.id
        choices = source.choices.get(path, source.class_choices.get((class_name, node.target.id)))
        key = Key(
            node.target.id,
            ast.unparse(node.annotation).strip("'\""),
            default,
            doc,
            nested,
            choices if isinstance(choices, tuple) else None,
        )
        section.keys.append(key)
        if nested:
            child = Section(path, doc)
            out.append(child)
            _walk(source, nested, child, out)


def render(all_sections: list[Section]) -> str:
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by `python scripts/config_reference.py` from rlx/config/*.py; do not edit by hand:",
        "     change a field's docstring in the schema and run the script again. -->",
        "",
        "A run config is YAML with the sections below; any key can be overridden on the command line as",
        "`section.key=value` (`rlx train configs/quickstart.yaml trainer.total_steps=10`). Loading is strict: an",
        "unknown key is an error naming the nearest valid one, and each value is checked before anything starts",
        "(`rlx config check CONFIG` runs those checks alone; [train.md](train.md#config) says more).",
        "",
        "Sections: " + ", ".join(f"[`{s.path}`](#{s.path.replace('.', '')})" for s in all_sections if s.path),
        "",
    ]
    for section in all_sections:
        lines += [
            f"## {section.path or 'top level'}",
            "",
            section.doc,
            "",
            "| key | type | default | allowed values | meaning |",
            "|---|---|---|---|---|",
        ]
        for key in section.keys:
            name = f"`{section.path + '.' if section.path else ''}{key.name}`"
            if key.section_class:
                anchor = (section.path + key.name if section.path else key.name).replace(".", "")
                doc = f"section: [{key.name}](#{anchor})"
                lines.append(f"| {name} | {key.section_class} | | | {doc} |")
                continue
            allowed = ", ".join(_show(c) for c in key.choices) if key.choices else ""
            lines.append(f"| {name} | {_cell(f'`{key.type}`')} | {key.default} | {allowed} | {_cell(key.doc)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    """A docstring as a table cell: pipes escaped, and angle brackets outside `code` shown, not read as HTML."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def missing_docstrings(all_sections: list[Section]) -> list[str]:
    return [f"{s.path + '.' if s.path else ''}{k.name}" for s in all_sections for k in s.keys if not k.doc]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the reference differs from the schema")
    parser.add_argument("--out", type=Path, default=OUT, help="the reference file (default: docs/config.md)")
    args = parser.parse_args(argv)
    found = sections()
    text = render(found)
    undocumented = missing_docstrings(found)
    if undocumented:
        print(
            "fields without a docstring (add the one-line string literal after each field in rlx/config/): "
            + ", ".join(undocumented),
            file=sys.stderr,
        )
    if not args.check:
        args.out.write_text(text)
        print(f"wrote {args.out} ({sum(len(s.keys) for s in found)} keys in {len(found)} sections)")
        return 0
    current = args.out.read_text() if args.out.exists() else ""
    if current == text:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(), text.splitlines(), str(args.out), "from the schema", lineterm="", n=0
    )
    changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    print(
        f"{args.out} is stale: {len(changed)} lines differ from the schema; run "
        "`python scripts/config_reference.py` to rewrite it. First differences:\n" + "\n".join(changed[:20]),
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
