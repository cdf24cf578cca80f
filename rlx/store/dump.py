"""Rollout dumps: every step's samples as safetensors + JSON, and the checks that make reading one safe.

``rollout.dump_dir`` gets one ``step_<NNNNNN>.safetensors`` per step (the samples that trained, as
ragged tensors: ``prompt_ids`` / ``completion_ids`` / ``logprobs`` / ``loss_mask`` flat with their
per-row lengths, ``rewards``, ``groups``; the step's generation metrics and completion texts as
JSON in the safetensors metadata) and ``manifest.json``: the schema version, the model's path and
fingerprint, the tokenizer's fingerprint, the sampling that made the samples, and each step file's
sha256. The manifest is rewritten (atomically) after each step, so a killed run leaves a dump of
the steps it finished.

Reading (``rollout.reuse``) starts with ``check_dump``, which pre-flight runs before any process
starts: it refuses a manifest that is not one (each field checked against the ``Manifest`` struct), an
unknown schema version, another model or tokenizer (by fingerprint), another group size, too few
steps, any step file whose sha256 is not the manifest's, and any step file whose contents do not hold
together (a missing or mistyped tensor, lengths that do not add up, rows the manifest does not list,
token ids past the model's vocabulary, logprobs or rewards that are not finite, bad metadata). A
checksum says only that a file is the one the manifest lists; a file edited and re-checksummed is
caught by the contents check, which names the file, the row and the fix. Only safetensors and JSON
are ever read: nothing in a dump can run code.

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
from typing import TYPE_CHECKING

import msgspec
import torch

from rlx.config.errors import ConfigError
from rlx.formats.hf_dir import TOKENIZER_FILES
from rlx.store.base import Sample, Status

if TYPE_CHECKING:
    from rlx.config.rollout import RolloutConfig
    from rlx.config.task import TaskConfig

SCHEMA_VERSION = 1
FORMAT = "rlx-rollout-dump"
MANIFEST = "manifest.json"
_STEP_FILE = re.compile(r"step_[0-9]{6,}\.safetensors")


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
    for name in TOKENIZER_FILES:
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
    def __init__(self, model_path: str, rollout: RolloutConfig, task: TaskConfig) -> None:
        """Each step's samples into rollout.dump_dir, with a manifest naming the model, the sampling and the task."""
        self.dir = Path(rollout.dump_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        r = rollout
        self.manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "model": {"path": str(Path(model_path).resolve()), "sha256": model_fingerprint(model_path)},
            "tokenizer": {"sha256": tokenizer_fingerprint(model_path)},
            "sampling": r.sampling.as_dict(),
            "task": {"name": task.name, "seed": task.seed},
            "steps": {},
        }

    def write(self, step: int, samples: list[Sample], metrics: dict[str, float], texts: list[str]) -> None:
        from safetensors.torch import save_file

        name = f"step_{step:06d}.safetensors"
        metadata = {"step": str(step), "metrics": json.dumps(metrics), "texts": json.dumps(texts)}
        tmp = self.dir / (name + ".tmp")
        save_file(_ragged(samples), str(tmp), metadata=metadata)
        os.replace(tmp, self.dir / name)
        self.manifest["steps"][str(step)] = {"file": name, "sha256": file_sha256(self.dir / name), "rows": len(samples)}
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, self.dir / MANIFEST)


def _ragged(samples: list[Sample]) -> dict[str, torch.Tensor]:
    def cat(tensors, dtype):
        return (
            torch.cat([torch.as_tensor(t, dtype=dtype).reshape(-1) for t in tensors])
            if tensors
            else torch.zeros(0, dtype=dtype)
        )

    out = {
        "prompt_ids": cat([s.prompt_ids for s in samples], torch.long),
        "prompt_lens": torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
        "completion_ids": cat([s.completion_ids for s in samples], torch.long),
        "completion_lens": torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long),
        "logprobs": cat([s.logprobs for s in samples], torch.float32),
        "loss_mask": cat([s.mask() for s in samples], torch.float32),
        "rewards": torch.tensor([s.reward for s in samples], dtype=torch.float32),
        "groups": torch.tensor([s.group for s in samples], dtype=torch.long),
        "status": torch.tensor([int(s.status) for s in samples], dtype=torch.long),
    }
    if samples and all(s.versions is not None for s in samples):
        out["versions"] = cat([s.versions for s in samples], torch.long)
    return out


class ModelEntry(msgspec.Struct):
    path: str
    sha256: str


class TokenizerEntry(msgspec.Struct):
    sha256: str


class SamplingEntry(msgspec.Struct):
    n: int


class StepEntry(msgspec.Struct):
    file: str
    sha256: str
    rows: int


class Manifest(msgspec.Struct):
    """The fields of ``manifest.json`` a reader relies on (others, e.g. ``task``, are informative)."""

    format: str
    schema_version: int
    model: ModelEntry
    tokenizer: TokenizerEntry
    sampling: SamplingEntry
    steps: dict[int, msgspec.Raw]
    """Step number -> its entry, decoded as a ``StepEntry`` by ``read_manifest`` (so an error names the step)."""


_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIX = "regenerate the dump (a run with rollout.dump_dir) or restore the file from a copy"
_TENSORS = {
    "prompt_ids": torch.long,
    "prompt_lens": torch.long,
    "completion_ids": torch.long,
    "completion_lens": torch.long,
    "logprobs": torch.float32,
    "loss_mask": torch.float32,
    "rewards": torch.float32,
    "groups": torch.long,
    "status": torch.long,
}
_PER_ROW = ("prompt_lens", "completion_lens", "rewards", "groups", "status")
_PER_TOKEN = ("completion_ids", "logprobs", "loss_mask", "versions")


class DumpError(ConfigError):
    """A dump that cannot be read as written; the message names the file, the field or row, and the fix."""


class Dump:
    """A checked dump (``check_dump``); ``step(k)`` reads step ``k``'s samples, checking its sha256 and its
    contents again (the file may have changed since)."""

    def __init__(self, path: Path, manifest: Manifest, entries: dict[int, StepEntry], vocab_size: int) -> None:
        self.path, self.manifest, self.entries, self.vocab_size = path, manifest, entries, vocab_size

    @property
    def steps(self) -> list[int]:
        return sorted(self.entries)

    def step(self, step: int) -> tuple[list[Sample], dict[str, float], list[str]]:
        return read_step(self.path, step, self.entries[step], self.manifest.sampling.n, self.vocab_size)


def read_manifest(path: Path) -> tuple[Manifest, dict[int, StepEntry]]:
    """``path/manifest.json`` checked field by field, and its step entries; a ``DumpError`` names the file,
    the field and the fix."""
    file, where = path / MANIFEST, f"rollout.reuse_dir={str(path)!r}"
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise DumpError(f"{where} holds no {MANIFEST}; set it to the rollout.dump_dir of a finished run") from None
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise DumpError(f"{file} is not valid JSON ({exc}); {_FIX}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DumpError(
            f'{file} is not an rlx rollout dump manifest (no "format": "{FORMAT}"); set '
            "rollout.reuse_dir to the rollout.dump_dir of an rlx run"
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise DumpError(
            f"{where}: dump schema version {data.get('schema_version')!r}, this rlx reads version "
            f"{SCHEMA_VERSION}; regenerate the dump with this rlx"
        )
    manifest = _decode(file, raw, Manifest, "")
    entries = {step: _decode(file, entry, StepEntry, f"steps.{step}") for step, entry in manifest.steps.items()}
    for step, entry in entries.items():
        _check_entry(file, step, entry)
    return manifest, entries


def _decode(file: Path, raw: bytes, kind: type, field: str):
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise DumpError(f"{file}: {_field_problem(str(exc), field)}; {_FIX}") from None


def _field_problem(message: str, prefix: str) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.sampling.n``` as ``field sampling.n: expected int, got str``."""
    problem, _, at = message.partition(" - at ")
    key_of = at.startswith("`key` in ")
    path = ".".join(p for p in (prefix, at.removeprefix("`key` in ").strip("`").removeprefix("$").strip(".")) if p)
    missing = re.fullmatch(r"Object missing required field `(\w+)`", problem)
    if missing:
        return f"field {'.'.join(p for p in (path, missing.group(1)) if p)} is missing"
    where = f"a key of field {path}" if key_of else f"field {path}" if path else "the manifest"
    return f"{where}: {problem.replace('`', '').lower()}"


def _check_entry(file: Path, step: int, entry: StepEntry) -> None:
    field = f"field steps.{step}"
    if step < 1:
        raise DumpError(f"{file}: {field}: step numbers start at 1; {_FIX}")
    if not _STEP_FILE.fullmatch(entry.file):
        raise DumpError(
            f"{file}: {field}.file={entry.file!r} is not a step file of this directory "
            f"(step_NNNNNN.safetensors); {_FIX}"
        )
    if not _SHA256.fullmatch(entry.sha256):
        raise DumpError(f"{file}: {field}.sha256={entry.sha256[:80]!r} is not a sha256 (64 hex digits); {_FIX}")
    if entry.rows < 1:
        raise DumpError(f"{file}: {field}.rows={entry.rows} must be >= 1; {_FIX}")


def read_step(
    path: Path, step: int, entry: StepEntry, n: int, vocab_size: int
) -> tuple[list[Sample], dict[str, float], list[str]]:
    """One step file, its sha256 checked against the manifest and every tensor against the others (lengths,
    dtypes, token ids below ``vocab_size``); a ``DumpError`` names the file, the row and the fix."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    file = path / entry.file
    if not file.is_file():
        raise DumpError(
            f"rollout.reuse_dir={str(path)!r}: {entry.file} is missing, the dump is incomplete; point "
            "rollout.reuse_dir at a complete dump"
        )
    data = file.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != entry.sha256:
        raise DumpError(
            f"rollout.reuse_dir={str(path)!r}: {entry.file} has sha256 {actual[:16]}..., the manifest "
            f"says {entry.sha256[:16]}...: the file was changed after it was written; {_FIX}"
        )
    try:
        tensors, metadata = load(data), _metadata(data)
    except (SafetensorError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise DumpError(f"{file} is not a readable safetensors file ({exc}); {_FIX}") from None
    _check_tensors(file, tensors, entry.rows, n, vocab_size)
    metrics, texts = _check_metadata(file, metadata, step)
    return _samples(tensors), metrics, texts


def _metadata(data: bytes) -> dict:
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    return header.get("__metadata__") or {}


def _check_tensors(file: Path, t: dict[str, torch.Tensor], rows: int, n: int, vocab_size: int) -> None:
    """Everything ``_samples`` relies on: shapes, dtypes, lengths that add up, values in range."""
    for key, dtype in dict(_TENSORS, **({"versions": torch.long} if "versions" in t else {})).items():
        if key not in t:
            raise DumpError(f"{file} lacks the tensor {key!r}; it was not written by this rlx's dump: {_FIX}")
        if t[key].dtype != dtype or t[key].dim() != 1:
            raise DumpError(
                f"{file}: tensor {key!r} is {t[key].dtype} of shape {list(t[key].shape)}, a dump "
                f"writes a 1-D {dtype}; {_FIX}"
            )
    for key in _PER_ROW:
        if len(t[key]) != rows:
            raise DumpError(f"{file}: tensor {key!r} has {len(t[key])} rows, the manifest says {rows}; {_FIX}")
    if rows % n:
        raise DumpError(f"{file}: {rows} rows are not whole groups of rollout.n={n}; {_FIX}")
    for lens, flat in (("prompt_lens", ("prompt_ids",)), ("completion_lens", _PER_TOKEN)):
        _check_lengths(file, t, lens, [k for k in flat if k in t])
    for ids, lens in (("prompt_ids", "prompt_lens"), ("completion_ids", "completion_lens")):
        _check_rows(
            file,
            t,
            ids,
            lens,
            (t[ids] < 0) | (t[ids] >= (vocab_size or 1 << 62)),
            f"a token id outside the model's vocabulary [0, {vocab_size})",
        )
    _check_rows(file, t, "logprobs", "completion_lens", ~torch.isfinite(t["logprobs"]), "a logprob that is not finite")
    bad = torch.nonzero(~torch.isfinite(t["rewards"])).flatten()
    if len(bad):  # training on it would make the step's loss NaN
        raise DumpError(f"{file}: row {int(bad[0])}: reward {t['rewards'][bad[0]].item()!r} is not finite; {_FIX}")
    mask = t["loss_mask"]
    _check_rows(
        file,
        t,
        "loss_mask",
        "completion_lens",
        ~torch.isfinite(mask) | (mask < 0) | (mask > 1),
        "a loss mask value outside [0, 1]",
    )
    statuses = torch.tensor([int(s) for s in Status])
    bad = torch.nonzero(~torch.isin(t["status"], statuses)).flatten()
    if len(bad):
        raise DumpError(
            f"{file}: row {int(bad[0])}: status {int(t['status'][bad[0]])} is not one of "
            f"{[int(s) for s in Status]}; {_FIX}"
        )


def _check_lengths(file: Path, t: dict[str, torch.Tensor], lens: str, flat: list[str]) -> None:
    negative = torch.nonzero(t[lens] < 0).flatten()
    if len(negative):
        raise DumpError(f"{file}: row {int(negative[0])}: {lens} is {int(t[lens][negative[0]])}; {_FIX}")
    total = int(t[lens].sum())
    for key in flat:
        if len(t[key]) != total:
            raise DumpError(
                f"{file}: tensor {key!r} holds {len(t[key])} values, its rows' {lens} add up to {total} "
                f"(a truncated or altered file); {_FIX}"
            )


def _check_rows(file: Path, t: dict[str, torch.Tensor], key: str, lens: str, bad: torch.Tensor, what: str) -> None:
    """Name the first row whose values (of ``key``, ragged by ``lens``) are ``bad``."""
    where = torch.nonzero(bad).flatten()
    if len(where):
        first = int(where[0])
        row = int(torch.searchsorted(torch.cumsum(t[lens], 0), first, right=True))
        raise DumpError(f"{file}: row {row}: {key} holds {what} ({t[key][first].item()!r}); {_FIX}")


def _check_metadata(file: Path, metadata: dict, step: int) -> tuple[dict[str, float], list[str]]:
    if metadata.get("step") != str(step):
        raise DumpError(
            f"{file}: its metadata says step {metadata.get('step')!r}, the manifest lists it as step {step}; {_FIX}"
        )
    return (
        _metadata_field(file, metadata, "metrics", dict[str, float], "an object of numbers"),
        _metadata_field(file, metadata, "texts", list[str], "a list of strings"),
    )


def _metadata_field(file: Path, metadata: dict, key: str, kind: type, what: str):
    try:
        return msgspec.json.decode(metadata.get(key, "{}" if key == "metrics" else "[]"), type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DumpError(f"{file}: metadata {key!r} is not {what} in JSON ({exc}); {_FIX}") from None


def _samples(t: dict[str, torch.Tensor]) -> list[Sample]:
    prompts = torch.split(t["prompt_ids"], t["prompt_lens"].tolist())
    lens = t["completion_lens"].tolist()
    completions, logps, masks = (torch.split(t[k], lens) for k in ("completion_ids", "logprobs", "loss_mask"))
    versions = torch.split(t["versions"], lens) if "versions" in t else [None] * len(lens)
    return [
        Sample(p, c, lp, float(r), m, v, -1, int(g), int(s))
        for p, c, lp, m, v, r, g, s in zip(
            prompts,
            completions,
            logps,
            masks,
            versions,
            t["rewards"].tolist(),
            t["groups"].tolist(),
            t["status"].tolist(),
            strict=True,
        )
    ]


def model_vocab_size(model_dir: str | Path) -> int:
    """Rows of the model's embedding (config.json's ``vocab_size``)."""
    config = json.loads(Path(model_dir, "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0)


def check_dump(model_path: str, rollout: RolloutConfig, total_steps: int, contents: bool = True) -> Dump:
    """Refuse a dump this run must not read (see the module docstring); the checked ``Dump``. ``contents``:
    also read every step file and check its tensors (pre-flight does; a step is checked again when read).
    ``total_steps``: trainer.total_steps, the steps rollout.reuse=replay or mix reads."""
    r = rollout
    path = Path(r.reuse_dir)
    where = f"rollout.reuse_dir={r.reuse_dir!r}"
    manifest, entries = read_manifest(path)
    if manifest.model.sha256 != model_fingerprint(model_path):
        raise DumpError(
            f"{where} was generated by the model at {manifest.model.path}, which differs from "
            f"model.path={model_path!r} (config or weight layout); reuse a dump of this model or "
            "set model.path to the dump's model"
        )
    if manifest.tokenizer.sha256 != tokenizer_fingerprint(model_path):
        raise DumpError(
            f"{where} was tokenized by another tokenizer than model.path={model_path!r}'s; its "
            "token ids would mean other text: reuse a dump made with this tokenizer"
        )
    if manifest.sampling.n != r.n:
        raise DumpError(
            f"{where} holds groups of {manifest.sampling.n} samples, rollout.n={r.n}; set "
            f"rollout.n={manifest.sampling.n}"
        )
    dump = Dump(path, manifest, entries, model_vocab_size(model_path))
    needed = r.reuse_steps if r.reuse == "first_k" else total_steps
    missing = [s for s in range(1, needed + 1) if s not in entries]
    if missing:
        held = f"steps {dump.steps[0]}..{dump.steps[-1]}" if dump.steps else "no step"
        raise DumpError(
            f"{where} holds {held} ({len(dump.steps)} in all); rollout.reuse={r.reuse} needs steps "
            f"1..{needed} (step {missing[0]} is missing): lower "
            f"{'rollout.reuse_steps' if r.reuse == 'first_k' else 'trainer.total_steps'} or dump "
            "more steps"
        )
    for step in dump.steps:
        if contents:
            dump.step(step)
        else:
            _check_sha(path, entries[step])
    return dump


def _check_sha(path: Path, entry: StepEntry) -> None:
    file = path / entry.file
    if not file.is_file() or file_sha256(file) != entry.sha256:
        raise DumpError(
            f"rollout.reuse_dir={str(path)!r}: {entry.file} is missing or changed since pre-flight checked it; {_FIX}"
        )
