"""No function in rlx/ takes its config untyped: a parameter named ``cfg`` or ``config``, or ending in ``_cfg``,
carries an annotation (``RunConfig`` or the section it reads), so a role's inputs show in its signature."""

import ast
from pathlib import Path

RLX = Path(__file__).parents[2] / "rlx"

BEING_TYPED: set[str] = set()
"""Modules whose config parameters are typed as part of the rank-protocol and sample-currency rework; each is
checked to still hold one, so the entry goes as soon as the module is typed."""


def untyped_config_params(path: Path, root: Path = RLX.parent) -> list[str]:
    """``file:line: function(param)`` for each unannotated config parameter of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
            if (arg.arg in ("cfg", "config") or arg.arg.endswith("_cfg")) and arg.annotation is None:
                name = getattr(node, "name", "lambda")
                found.append(f"{path.relative_to(root).as_posix()}:{arg.lineno}: {name}({arg.arg})")
    return found


def test_no_untyped_config_parameter_in_rlx():
    offenders = [
        hit
        for path in sorted(RLX.rglob("*.py"))
        if path.relative_to(RLX).as_posix() not in BEING_TYPED
        for hit in untyped_config_params(path)
    ]
    assert not offenders, (
        "config parameters without a type (annotate each with RunConfig or the section it "
        "reads, imported under TYPE_CHECKING):\n" + "\n".join(offenders)
    )


def test_the_modules_being_typed_still_need_their_exemption():
    typed = [
        name for name in sorted(BEING_TYPED) if not (RLX / name).is_file() or not untyped_config_params(RLX / name)
    ]
    assert not typed, f"remove from BEING_TYPED (no untyped config parameter left, or gone): {typed}"


def test_the_counter_finds_an_untyped_parameter(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(cfg, x: int, *, store_cfg=None):\n    pass\n\n\ndef g(cfg: 'RunConfig'):\n    pass\n\n\n"
        "h = lambda config: config\n"
    )
    assert untyped_config_params(sample, tmp_path) == [
        "sample.py:1: f(cfg)",
        "sample.py:1: f(store_cfg)",
        "sample.py:9: lambda(config)",
    ]
