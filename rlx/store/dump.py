"""Rollout dumps: every step's samples as safetensors + JSON, and the checks that make reading one safe.

``rollout.dump_dir`` gets one ``step_<NNNNNN>.safetensors`` per step (the samples that trained, as
ragged tensors: ``prompt_ids`` / ``completion_ids`` / ``logprobs`` / ``loss_mask`` flat with their
per-row lengths, ``rewards``, ``groups``; the step's generation metrics and completion texts as
JSON in the safetensors metadata) and ``manifest.json``: the schema version, the model's path and
fingerprint, the tokenizer's fingerprint, the sampling that made the samples, and each step file's
sha256. The manifest is rewritten (atomically) after each step, so a killed run leaves a dump of
the steps it finished.

Reading (``rollout.reuse``) starts with ``check_dump``, which pre-flight runs before any process
starts: it refuses an unknown schema version, another model or tokenizer (by fingerprint), another
group size, too few steps, and any step file whose sha256 is not the manifest's. Only safetensors
and JSON are ever read: nothing in a dump can run code.

Fingerprints: the model's is the sha256 of its config.json and of each weight file's name, size
and safetensors header (shapes, dtypes, offsets; hashing the weights' bytes would take minutes
for a large model); the tokenizer's is the sha256 of its tokenizer files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path

import torch

from rlx.config.errors import ConfigError
from rlx.store.base import Sample

SCHEMA_VERSION = 1
FORMAT = "rlx-rollout-dump"
MANIFEST = "manifest.json"
_STEP_FILE = re.compile(r"step_[0-9]{6,}\.safetensors")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "added_tokens.json", "chat_template.jinja")


def model_fingerprint(model_dir: str | Path) -> str:
    model_dir = Path(model_dir)
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            digest.update(f"{path.name}:{path.stat().st_size}:".encode())
            digest.update(f.read(min(header_len, 100 << 20)))
    return digest.hexdigest()


def tokenizer_fingerprint(model_dir: str | Path) -> str:
    digest = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        path = Path(model_dir, name)
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class DumpWriter:
    def __init__(self, cfg) -> None:
        self.dir = Path(cfg.rollout.dump_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        r = cfg.rollout
        self.manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                         "model": {"path": str(Path(cfg.model.path).resolve()),
                                   "sha256": model_fingerprint(cfg.model.path)},
                         "tokenizer": {"sha256": tokenizer_fingerprint(cfg.model.path)},
                         "sampling": {"n": r.n, "max_tokens": r.max_tokens, "temperature": r.temperature,
                                      "top_p": r.top_p, "top_k": r.top_k},
                         "task": {"name": cfg.task.name, "seed": cfg.task.seed}, "steps": {}}

    def write(self, step: int, samples: list[Sample], metrics: dict[str, float], texts: list[str]) -> None:
        from safetensors.torch import save_file

        name = f"step_{step:06d}.safetensors"
        metadata = {"step": str(step), "metrics": json.dumps(metrics), "texts": json.dumps(texts)}
        tmp = self.dir / (name + ".tmp")
        save_file(_ragged(samples), str(tmp), metadata=metadata)
        os.replace(tmp, self.dir / name)
        self.manifest["steps"][str(step)] = {"file": name, "sha256": file_sha256(self.dir / name),
                                             "rows": len(samples)}
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, self.dir / MANIFEST)


def _ragged(samples: list[Sample]) -> dict[str, torch.Tensor]:
    def cat(tensors, dtype):
        return torch.cat([torch.as_tensor(t, dtype=dtype).reshape(-1) for t in tensors]) if tensors else \
            torch.zeros(0, dtype=dtype)

    out = {"prompt_ids": cat([s.prompt_ids for s in samples], torch.long),
           "prompt_lens": torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
           "completion_ids": cat([s.completion_ids for s in samples], torch.long),
           "completion_lens": torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long),
           "logprobs": cat([s.logprobs for s in samples], torch.float32),
           "loss_mask": cat([s.mask() for s in samples], torch.float32),
           "rewards": torch.tensor([s.reward for s in samples], dtype=torch.float32),
           "groups": torch.tensor([s.group for s in samples], dtype=torch.long),
           "status": torch.tensor([int(s.status) for s in samples], dtype=torch.long)}
    if samples and all(s.versions is not None for s in samples):
        out["versions"] = cat([s.versions for s in samples], torch.long)
    return out


class Dump:
    """A checked dump (``check_dump``); ``step(k)`` reads step ``k``'s samples, verifying its checksum again."""

    def __init__(self, path: Path, manifest: dict) -> None:
        self.path, self.manifest = path, manifest

    @property
    def steps(self) -> list[int]:
        return sorted(int(s) for s in self.manifest["steps"])

    def step(self, step: int) -> tuple[list[Sample], dict[str, float], list[str]]:
        from safetensors import safe_open

        entry = self.manifest["steps"][str(step)]
        path = self.path / entry["file"]
        _check_file(path, entry)
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        return _samples(tensors, path), json.loads(metadata.get("metrics", "{}")), \
            json.loads(metadata.get("texts", "[]"))


def _samples(t: dict[str, torch.Tensor], path: Path) -> list[Sample]:
    needed = ("prompt_ids", "prompt_lens", "completion_ids", "completion_lens", "logprobs", "loss_mask", "rewards",
              "groups", "status")
    missing = [k for k in needed if k not in t]
    if missing:
        raise ConfigError(f"rollout dump file {path} lacks {missing}; it was not written by this rlx's dump")
    prompts = torch.split(t["prompt_ids"], t["prompt_lens"].tolist())
    lens = t["completion_lens"].tolist()
    completions, logps, masks = (torch.split(t[k], lens) for k in ("completion_ids", "logprobs", "loss_mask"))
    versions = torch.split(t["versions"], lens) if "versions" in t else [None] * len(lens)
    return [Sample(p, c, lp, float(r), m, v, -1, int(g), int(s))
            for p, c, lp, m, v, r, g, s in zip(prompts, completions, logps, masks, versions, t["rewards"].tolist(),
                                                t["groups"].tolist(), t["status"].tolist())]


def _check_file(path: Path, entry: dict) -> None:
    where = f"rollout.reuse_dir={str(path.parent)!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: {path.name} is missing, the dump is incomplete; point rollout.reuse_dir at a "
                          "complete dump")
    actual = file_sha256(path)
    if actual != entry.get("sha256"):
        raise ConfigError(f"{where}: {path.name} has sha256 {actual[:16]}..., the manifest says "
                          f"{str(entry.get('sha256'))[:16]}...: the file was changed after it was written; "
                          "regenerate the dump (rollout.dump_dir) or restore the file")


def check_dump(cfg) -> Dump:
    """Refuse a dump this run must not read (see the module docstring); the checked ``Dump``."""
    r = cfg.rollout
    path = Path(r.reuse_dir)
    where = f"rollout.reuse_dir={r.reuse_dir!r}"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where} holds no {MANIFEST}; set it to the rollout.dump_dir of a finished run") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {MANIFEST} is not valid JSON ({exc}); regenerate the dump") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(f"{where}: {MANIFEST} is not an rlx rollout dump manifest")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{where}: dump schema version {manifest.get('schema_version')!r}, this rlx reads version "
                          f"{SCHEMA_VERSION}; regenerate the dump with this rlx")
    if manifest["model"]["sha256"] != model_fingerprint(cfg.model.path):
        raise ConfigError(f"{where} was generated by the model at {manifest['model']['path']}, which differs from "
                          f"model.path={cfg.model.path!r} (config or weight layout); reuse a dump of this model or "
                          "set model.path to the dump's model")
    if manifest["tokenizer"]["sha256"] != tokenizer_fingerprint(cfg.model.path):
        raise ConfigError(f"{where} was tokenized by another tokenizer than model.path={cfg.model.path!r}'s; its "
                          "token ids would mean other text: reuse a dump made with this tokenizer")
    if manifest["sampling"]["n"] != r.n:
        raise ConfigError(f"{where} holds groups of {manifest['sampling']['n']} samples, rollout.n={r.n}; set "
                          f"rollout.n={manifest['sampling']['n']}")
    dump = Dump(path, manifest)
    needed = r.reuse_steps if r.reuse == "first_k" else cfg.trainer.total_steps
    missing = [s for s in range(1, needed + 1) if str(s) not in manifest["steps"]]
    if missing:
        raise ConfigError(f"{where} holds steps {dump.steps[:1] + dump.steps[-1:]} (first, last); rollout.reuse="
                          f"{r.reuse} needs steps 1..{needed} (step {missing[0]} is missing): lower "
                          f"{'rollout.reuse_steps' if r.reuse == 'first_k' else 'trainer.total_steps'} or dump more steps")
    for step, entry in manifest["steps"].items():
        if not isinstance(entry.get("file"), str) or not _STEP_FILE.fullmatch(entry["file"]):
            raise ConfigError(f"{where}: the manifest names {entry.get('file')!r} for step {step}, which is not a "
                              "step file of this directory (step_NNNNNN.safetensors)")
        _check_file(path / entry["file"], entry)
    return dump
