import subprocess
import sys

from typer.testing import CliRunner

from rlx import __version__
from rlx.cli import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"rlx {__version__}"


def test_help_lists_only_registered_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    registered = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name in registered:
        assert name in result.output
    assert "config" in registered


def test_cli_import_stays_light():
    code = (
        "import sys, rlx.cli; heavy = [m for m in ('vllm', 'megatron', 'textual', 'torch') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing rlx.cli pulled in: {out.stdout.strip()}"


def test_error_lines_show_bracketed_user_text_verbatim():
    """A user's value such as ``[red]abc`` is printed as written, never taken as console markup."""
    result = runner.invoke(app, ["config", "check", "configs/quickstart.yaml", "trainer.lr='[red]abc'"])
    assert result.exit_code == 2
    assert "'[red]abc'" in result.output, result.output


def test_error_lines_show_escape_sequences_in_user_text_as_escapes(tmp_path):
    """A path, override or file name holding terminal escape sequences is quoted with them made visible,
    so an error line cannot clear the screen or retitle the terminal."""
    cases = [
        ["train", str(tmp_path / "no\x1b[2Jsuch.yaml")],
        ["config", "check", "configs/quickstart.yaml", "rollout.backend=\x1b]0;title\x07x"],
        ["trace-view", str(tmp_path / "trace\x1b[31m"), "--summary"],
        ["convert-ckpt", str(tmp_path / "src\u202e"), str(tmp_path / "out")],
    ]
    for args in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "\x1b" not in result.output and "\u202e" not in result.output, repr(result.output)
        assert "\\x1b" in result.output or "\\u202e" in result.output, repr(result.output)


def test_config_show_redacts_secrets():
    result = runner.invoke(app, ["config", "show", "configs/quickstart.yaml", "rollout.auth_token=s3cret-value"])
    assert result.exit_code == 0, result.output
    assert "s3cret-value" not in result.output
    assert "auth_token: '***'" in result.output
    for value in ("[s3cret-value]", "{a: s3cret-value}"):  # a wrong type is named without echoing the token
        result = runner.invoke(app, ["config", "check", "configs/quickstart.yaml", f"rollout.auth_token={value}"])
        assert result.exit_code == 2 and "rollout.auth_token=*** is not a string" in result.output, result.output
        assert "s3cret" not in result.output


def test_bad_output_paths_sizes_and_budgets_are_one_line(tmp_path):
    import json

    trace = tmp_path / "trainer0.1.jsonl"
    trace.write_text(
        json.dumps(
            {
                "k": "H",
                "format": "rlx-trace",
                "version": 1,
                "name": "trainer0",
                "role": "trainer",
                "pid": 1,
                "host": "h",
                "wall_ns": 1,
                "mono_ns": 1,
            }
        )
        + "\n"
        + json.dumps({"k": "X", "i": 1, "n": "step", "t": 0, "d": 5})
        + "\n"
    )
    cases = [
        (["trace-view", str(trace), "--export", "perfetto", str(tmp_path)], "that is a directory"),
        (["trace-view", str(trace), "--export", "perfetto", str(trace / "t.json")], "is a file, not a directory"),
        (["trace-view", str(trace), "--screenshot", str(tmp_path / "s.svg"), "--size", "0x-5"], "must be in [1, 1000]"),
        (["bench-sync", "--memory-gb", "nan"], "--memory-gb nan must be a positive number"),
        (["bench-sync", "--target", "server", "--server", "garbage"], "must start with tcp:// or ipc://"),
    ]
    for args, expected in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output, result.output


def test_rollout_serve_refuses_an_ipc_address_it_cannot_bind_before_loading(tiny_model_dir, tmp_path):
    from tests.helpers import write_config

    config = str(write_config(tmp_path / "serve.yaml", tiny_model_dir, rollout={"backend": "hf"}))
    import socket

    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a live server's socket
    busy.bind(str(tmp_path / "busy.sock"))
    busy.listen()
    taken = socket.create_server(("127.0.0.1", 0))  # a port another process listens on
    with busy, taken:
        for args, expected in [
            (["--address", f"tcp://127.0.0.1:{taken.getsockname()[1]}"], "Address already in use"),
            (["--address", f"ipc://{tmp_path}/no/such/dir/s.sock"], "does not exist; create it"),
            (["--address", f"ipc://{tmp_path}/{'x' * 120}.sock"], "at most 107 bytes"),
            (["--address", f"ipc://{tmp_path}/busy.sock"], "another process is serving there"),
            (["--index", "-1"], "--index -1 must be >= 0"),
        ]:
            result = runner.invoke(app, ["rollout-serve", config, *args])
            assert result.exit_code == 2 and expected in result.output, result.output


def test_a_run_directory_too_deep_for_a_unix_socket_gets_a_short_server_address(tmp_path):
    from rlx.config.load import load_config
    from rlx.net import MAX_IPC_PATH_BYTES, server_address

    deep = tmp_path.joinpath(*["abcdefghij"] * 12)
    cfg = load_config("configs/quickstart.yaml", [f"trainer.output_dir={deep}"])
    address = server_address(cfg.rollout, cfg.trainer.output_dir, 0)
    assert address.startswith("ipc://") and len(address.removeprefix("ipc://").encode()) <= MAX_IPC_PATH_BYTES
    assert server_address(cfg.rollout, cfg.trainer.output_dir, 1) != address
