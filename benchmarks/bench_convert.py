"""Benchmark of the checkpoint tools on a synthetic checkpoint, against a plain script and the disk.

    python benchmarks/bench_convert.py                         # 1.7 GB bf16: fp8-block, the plain script, the disk
    python benchmarks/bench_convert.py --rounds 5 --json bench.json
    python benchmarks/bench_convert.py --size-gb 8 --ops fp8-block,fp8-channel,hf-reshard --rounds 1

What it does, in one temporary directory on the chosen disk (removed afterwards):

1. writes a synthetic Llama-shaped bf16 checkpoint of ``--size-gb`` (random weights, ``--shard-mb``
   shards, hidden size 2048: q/k/v/o, gate/up/down, norms, embeddings and lm_head);
2. runs every side once per round, in a fresh child process each, rounds in alternating order
   (forward, then backward) so that drift and other jobs on the machine hit every side alike:
   - each rlx operation (``--ops``): the library calls the CLI makes, timed from building the job
     (which validates the source) to the renamed, fsynced output;
   - ``fp8-rival``: the plain script a user would write for block FP8, written below:
     ``safetensors.torch.load_file`` a shard, quantize each 2-D weight per 128x128 block with the
     same arithmetic, ``save_file``; then one fsync per written file so that its bytes are on the
     disk like everyone else's (the plain script would not fsync; its time would then stop before
     its writes reached the disk);
   - ``ceiling``: the disk alone, no compute: two threads read every source shard with 16 MiB
     reads and write as many bytes as the FP8 output has (the first part of each chunk read; all
     of it when no FP8 side runs), each write handed to the disk at once as rlx does, each output
     fsynced: the same bytes read and written as rlx's, the same way;
3. checks, after the first round, that rlx's and the rival's FP8 outputs hold identical tensors,
   and what each wrote as index ``total_size`` and ``ignored_layers``.

Before every run the source files are evicted from the page cache (``posix_fadvise`` DONTNEED
on those files only), so reads come from the disk; outputs are written into fresh directories.
Timings exclude interpreter start-up and imports. GB/s is source bytes / seconds (bytes read);
"of ceiling" divides the side's median GB/s by the ceiling's. Peak RSS is each side's
``getrusage(RUSAGE_CHILDREN).ru_maxrss`` as seen by a small parent process that starts only that
side, next to a side that only imports the modules the rlx side uses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlx.convert.safetensors_writer import (  # noqa: E402 - after the repository is on sys.path
    OutTensor,
    plan_shards,
    write_index,
    write_shard,
)

OPS = {
    "fp8-block": "rlx fp8-convert --strategy block (128x128)",
    "fp8-channel": "rlx fp8-convert --strategy channel",
    "fp8-tensor": "rlx fp8-convert --strategy tensor",
    "hf-reshard": "rlx convert-ckpt --to hf (re-shard, streaming copy)",
    "trainer-to-hf": "rlx convert-ckpt trainer checkpoint -> hf (sha256 verify + copy)",
    "hf-to-torch_dist": "rlx convert-ckpt --to torch_dist (megatron-core save)",
    "fp8-rival": "plain script: load_file -> quantize each 2-D weight per block -> save_file (+ fsync)",
    "ceiling": "the disk: read the source, write the output's bytes, 16 MiB at a time, 2 threads, fsync",
}
CHUNK = 16 << 20


def synthetic_config(size_bytes: int, hidden: int) -> dict:
    inter, kv = hidden * 11 // 4 // 256 * 256, hidden // 4
    per_layer = 2 * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden)
    vocab = 32000
    layers = max(1, round((size_bytes - 4 * vocab * hidden) / per_layer))
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": kv // 64,
        "head_dim": 64,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def synthetic_tensors(config: dict) -> list[OutTensor]:
    h, i, kv, vocab = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_key_value_heads"] * 64,
        config["vocab_size"],
    )
    shapes = {"model.embed_tokens.weight": (vocab, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (vocab, h)})
    return [OutTensor(name, torch.bfloat16, shape, _random_rows(shape)) for name, shape in shapes.items()]


def _random_rows(shape):
    def chunks():
        rows = shape[0] if len(shape) == 1 else max(1, CHUNK // (2 * shape[1]))
        for start in range(0, shape[0], rows):
            n = min(rows, shape[0] - start)
            yield (torch.randn((n,) + tuple(shape[1:])) * 0.02).to(torch.bfloat16)

    return chunks


def write_synthetic(src: Path, size_bytes: int, hidden: int, shard_bytes: int) -> int:
    src.mkdir()
    config = synthetic_config(size_bytes, hidden)
    (src / "config.json").write_text(json.dumps(config, indent=2))
    shards = plan_shards(synthetic_tensors(config), shard_bytes)
    for shard in shards:
        write_shard(src / shard.file_name, shard)
    write_index(src, shards)
    return sum(s.nbytes for s in shards)


def evict(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


RLX_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from rich.console import Console
    op, src, dst, workers = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    from rlx.convert.convert_ckpt import ConvertOptions, build_job
    from rlx.convert.fp8.job import Fp8Options, fp8_job
    if op == "hf-to-torch_dist":
        import rlx.convert.megatron.runtime
    if op == "baseline":
        print(json.dumps({"seconds": 0.0})); sys.exit(0)
    start = time.perf_counter()  # building the job validates (and for trainer checkpoints hashes) the source
    if op.startswith("fp8-"):
        options = Fp8Options(strategy=op[4:])
        if workers:
            options.workers = workers
        job = fp8_job(src, options)
    else:
        to = "torch_dist" if op == "hf-to-torch_dist" else "hf"
        job = build_job(src, ConvertOptions(to=to, shard_bytes=10**9, workers=workers or 2))
    job.run(dst, Console(quiet=True), show_progress=False)
    print(json.dumps({"seconds": time.perf_counter() - start}))
""")

RIVAL_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import torch
    from safetensors.torch import load_file, save_file

    def quantize_block(w, block=128):
        rows, cols = w.shape
        w = torch.nn.functional.pad(w.float(), (0, -cols % block, 0, -rows % block))
        blocks = w.reshape(w.shape[0] // block, block, w.shape[1] // block, block)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.reshape(w.shape)[:rows, :cols].contiguous(), scale

    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    start = time.perf_counter()
    dst.mkdir()
    weight_map = {}
    for path in sorted(src.glob("*.safetensors")):
        out = {}
        for name, tensor in load_file(path).items():
            if tensor.ndim == 2 and "embed" not in name and "lm_head" not in name:
                out[name], out[name + "_scale_inv"] = quantize_block(tensor)
            else:
                out[name] = tensor
        save_file(out, dst / path.name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, path.name))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = weight_map
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for path in dst.iterdir():  # not in the plain script: its bytes must reach the disk as the others' do
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    print(json.dumps({"seconds": time.perf_counter() - start}))
""")

CEILING_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    src, dst, chunk, write_ratio = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])

    def copy(path):
        buf = bytearray(chunk)
        with open(path, "rb", buffering=0) as fin, open(dst / path.name, "wb", buffering=0) as fout:
            while n := fin.readinto(buf):
                offset = fout.tell()
                fout.write(memoryview(buf)[:round(n * write_ratio)])
                os.posix_fadvise(fout.fileno(), offset, round(n * write_ratio), os.POSIX_FADV_DONTNEED)
            os.fsync(fout.fileno())

    start = time.perf_counter()
    dst.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(copy, sorted(src.glob("*.safetensors"))))
    print(json.dumps({"seconds": time.perf_counter() - start}))
""")


MEASURED_CHILD = textwrap.dedent("""
    import json, resource, subprocess, sys
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    print(json.dumps({"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-3000:],
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
""")
"""Runs a side and reports its peak RSS. A process's ru_maxrss includes the memory image it was forked
from (the kernel records the old image's high-water mark at exec), so a side forked straight from this
process would report at least this process's size: the side is forked from this small one instead."""


def run_child(side: str, src: Path, dst: Path, workers: int, write_ratio: float = 1.0) -> dict:
    """One side in a fresh process: its seconds (printed by the side) and its peak RSS."""
    if side == "fp8-rival":
        argv = ["-c", RIVAL_CHILD, str(src), str(dst)]
    elif side == "ceiling":
        argv = ["-c", CEILING_CHILD, str(src), str(dst), str(CHUNK), str(write_ratio)]
    else:
        argv = ["-c", RLX_CHILD, side, str(src), str(dst), str(workers)]
    done = subprocess.run(
        [sys.executable, "-c", MEASURED_CHILD, sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    measured = json.loads(done.stdout)
    if measured["returncode"] != 0:
        raise RuntimeError(f"{side} failed ({measured['returncode']}):\n{measured['stderr']}")
    result = json.loads(measured["stdout"].strip().splitlines()[-1])
    result["peak_rss_bytes"] = measured["peak_rss_bytes"]
    return result


def make_trainer_checkpoint(src: Path, ckpt: Path) -> None:
    from rlx.formats.checkpoint import write_manifest

    (ckpt / "hf").mkdir(parents=True)
    files = sorted(p.name for p in src.glob("*.safetensors"))
    for name in files:
        os.link(src / name, ckpt / name)
    shutil.copy2(src / "config.json", ckpt / "hf" / "config.json")
    write_manifest(ckpt, 1, files, {})


def measure(args, work: Path, console: Console) -> dict:
    src = work / "src"
    with console.status(f"writing a synthetic {args.size_gb:g} GB checkpoint"):
        total = write_synthetic(src, int(args.size_gb * 1e9), args.hidden, int(args.shard_mb * 1e6))
    files = sorted(src.glob("*.safetensors"))
    sources = {side: src for side in args.sides}
    if "trainer-to-hf" in args.sides:
        sources["trainer-to-hf"] = work / "run" / "checkpoints" / "step_00000001"
        make_trainer_checkpoint(src, sources["trainer-to-hf"])
    write_ratio = fp8_output_bytes(src) / total if any(s.startswith("fp8-") for s in args.sides) else 1.0
    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    verification = None
    for round_index in range(args.rounds):
        order = args.sides if round_index % 2 == 0 else args.sides[::-1]
        for side in order:
            evict(files)
            with console.status(f"round {round_index + 1}/{args.rounds}: {side}"):
                runs[side].append(run_child(side, sources[side], work / side, args.workers, write_ratio))
            if not (round_index == 0 and side in VERIFIED):
                shutil.rmtree(work / side)
        if round_index == 0 and all(side in args.sides for side in VERIFIED):
            with console.status("comparing the rlx and rival outputs"):
                verification = verify(work / "fp8-block", work / "fp8-rival")
        for side in VERIFIED:
            shutil.rmtree(work / side, ignore_errors=True)
    baseline = run_child("baseline", src, work / "none", 1)["peak_rss_bytes"]
    return {
        "source_bytes": total,
        "source_files": len(files),
        "baseline_rss_bytes": baseline,
        "ceiling_write_bytes": round(total * write_ratio),
        "sides": {side: summarize(side_runs, total) for side, side_runs in runs.items()},
        "verification": verification,
    }


VERIFIED = ("fp8-block", "fp8-rival")


def fp8_output_bytes(src: Path) -> int:
    """Tensor bytes of ``rlx fp8-convert``'s output (block strategy), from the plan alone."""
    from rlx.convert.fp8.job import Fp8Options, fp8_job

    return sum(shard.nbytes for shard in fp8_job(src, Fp8Options()).shards)


def summarize(side_runs: list[dict], total: int) -> dict:
    seconds = statistics.median(r["seconds"] for r in side_runs)
    return {
        "runs": side_runs,
        "seconds": seconds,
        "gb_per_s": total / seconds / 1e9,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in side_runs),
    }


def verify(ours: Path, rival: Path) -> dict:
    """Tensor by tensor (bytes), and the metadata each side wrote; one tensor in memory at a time."""
    from safetensors import safe_open

    def tensors(root: Path) -> dict[str, Path]:
        index = json.loads((root / "model.safetensors.index.json").read_text())
        return {name: root / file for name, file in index["weight_map"].items()}

    ours_map, rival_map = tensors(ours), tensors(rival)
    differing = []
    for name in sorted(ours_map.keys() & rival_map.keys()):
        with safe_open(ours_map[name], "pt") as a, safe_open(rival_map[name], "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                differing.append(name)
    return {
        "tensors_compared": len(ours_map.keys() & rival_map.keys()),
        "differing": differing,
        "only_rlx": sorted(ours_map.keys() - rival_map.keys()),
        "only_rival": sorted(rival_map.keys() - ours_map.keys()),
        "rlx": _metadata(ours),
        "rival": _metadata(rival),
    }


def _metadata(root: Path) -> dict:
    """Index total_size against the tensors' bytes, and the unquantized layers the config names."""
    from safetensors import safe_open

    nbytes = 0
    for path in root.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                part = f.get_slice(name)
                numel = 1
                for dim in part.get_shape():
                    numel *= dim
                nbytes += numel * {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}[part.get_dtype()]
    index = json.loads((root / "model.safetensors.index.json").read_text())
    qconfig = json.loads((root / "config.json").read_text())["quantization_config"]
    return {
        "index_total_size": index["metadata"].get("total_size"),
        "tensor_bytes": nbytes,
        "ignored_layers": qconfig.get("ignored_layers"),
    }


def render(report: dict, console: Console) -> None:
    sides, ceiling = report["sides"], report["sides"].get("ceiling")
    table = Table(
        title=f"checkpoint conversion: {report['source_bytes'] / 1e9:.2f} GB bf16 in "
        f"{report['source_files']} shards, {report['machine']['cpus']} CPUs, median of "
        f"{report['rounds']} rounds (load average {report['machine']['load_average_1m']:.1f} "
        "at the end)"
    )
    for column in ("side", "seconds", "GB/s read", "of ceiling", "peak RSS", "above imports"):
        table.add_column(column, justify="left" if column == "side" else "right")
    for side, r in sides.items():
        share = f"{r['gb_per_s'] / ceiling['gb_per_s']:.0%}" if ceiling else "-"
        above = r["peak_rss_bytes"] - report["baseline_rss_bytes"]
        table.add_row(
            side,
            f"{r['seconds']:.2f}",
            f"{r['gb_per_s']:.2f}",
            share,
            f"{r['peak_rss_bytes'] / 1e9:.2f} GB",
            f"{above / 1e9:+.2f} GB" if side in OPS_RLX else "",
        )
    console.print(table)
    for side in sides:
        seconds = ", ".join(f"{r['seconds']:.2f}" for r in sides[side]["runs"])
        console.print(f"  {side}: {OPS[side]} (runs: {seconds} s)", highlight=False)
    console.print(
        f"Source evicted from the page cache before every run; outputs fresh and fsynced; the "
        f"ceiling wrote {report['ceiling_write_bytes'] / 1e9:.2f} GB. 'above imports' subtracts a child that only "
        f"imports rlx's conversion modules "
        f"({report['baseline_rss_bytes'] / 1e9:.2f} GB). Work dir on {report['work_dir']}.",
        highlight=False,
    )
    _render_verification(report.get("verification"), console)


OPS_RLX = {op for op in OPS if op not in ("fp8-rival", "ceiling")}


def _render_verification(check: dict | None, console: Console) -> None:
    if not check:
        return
    same = check["tensors_compared"] - len(check["differing"])
    console.print(
        f"Output check: {same} of {check['tensors_compared']} tensors byte-identical between rlx and "
        f"the rival" + (f"; differing: {', '.join(check['differing'][:5])}" if check["differing"] else ""),
        highlight=False,
    )
    for side in ("rlx", "rival"):
        meta = check[side]
        right = (
            "right"
            if meta["index_total_size"] == meta["tensor_bytes"]
            else f"wrong ({meta['index_total_size']} for {meta['tensor_bytes']} bytes of tensors)"
        )
        layers = "missing" if meta["ignored_layers"] is None else f"{len(meta['ignored_layers'])} modules"
        console.print(f"  {side}: index total_size {right}; ignored_layers {layers}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.7, help="synthetic checkpoint size (default 1.7 GB)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size of the synthetic model")
    parser.add_argument("--shard-mb", type=float, default=250, help="shard size of the synthetic checkpoint")
    parser.add_argument(
        "--ops", default="fp8-block,fp8-rival,ceiling", help=f"comma-separated sides, from {', '.join(OPS)}"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every side, alternating order")
    parser.add_argument("--workers", type=int, default=0, help="rlx threads (0: each command's default)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="parent of the temporary work directory")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    args.sides = [op for op in args.ops.split(",") if op]
    unknown = set(args.sides) - set(OPS)
    if unknown or args.rounds < 1:
        parser.error(
            f"unknown --ops {sorted(unknown)}; choose from {', '.join(OPS)}" if unknown else "--rounds must be >= 1"
        )
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="rlx-bench-convert-", dir=args.dir))
    try:
        report = measure(args, work, console)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.update(
        rounds=args.rounds,
        work_dir=str(Path(args.dir).resolve()),
        size_gb=args.size_gb,
        machine={
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
    )
    render(report, console)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
