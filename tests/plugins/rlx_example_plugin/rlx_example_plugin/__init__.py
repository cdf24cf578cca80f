"""Example rlx checkpoint plugins.

``Recorder`` appends one JSON line per hook call to the file named by ``RLX_EXAMPLE_PLUGIN_LOG`` and
writes ``example_plugin.json`` into each checkpoint it sees saved (so the manifest lists it).
``FailingSave`` raises in its second ``on_save``.
"""

import json
import os
from pathlib import Path


class Recorder:
    def _record(self, **entry) -> None:
        with open(os.environ["RLX_EXAMPLE_PLUGIN_LOG"], "a") as f:
            f.write(json.dumps(entry) + "\n")

    def on_save(self, ckpt_dir: Path, step: int) -> None:
        (Path(ckpt_dir) / "example_plugin.json").write_text(json.dumps({"step": step}))
        self._record(hook="on_save", step=step, dir=Path(ckpt_dir).name)

    def on_load(self, ckpt_dir: Path, step: int) -> None:
        self._record(hook="on_load", step=step, dir=Path(ckpt_dir).name)

    def after_step(self, step: int, metrics: dict) -> None:
        self._record(hook="after_step", step=step, has_loss="loss" in metrics)


class FailingSave:
    def __init__(self) -> None:
        self.saves = 0

    def on_save(self, ckpt_dir: Path, step: int) -> None:
        self.saves += 1
        if self.saves == 2:
            raise OSError(f"example upload of step {step} failed")
