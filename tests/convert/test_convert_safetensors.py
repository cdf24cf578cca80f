"""The streaming safetensors reader/writer against the safetensors library, and bad-input errors."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rlx.convert.errors import ConvertError
from rlx.convert.safetensors_io import SafetensorsDir, read_header
from rlx.convert.safetensors_writer import OutTensor, plan_shards, write_index, write_shard


def _bytes(t):
    return t.reshape(-1).view(torch.uint8)


def _tensors():
    torch.manual_seed(0)
    return {
        "a.weight": torch.randn(37, 11),
        "b.bias": torch.randn(5).to(torch.bfloat16),
        "c.idx": torch.arange(7, dtype=torch.int64),
        "d.scalar": torch.tensor(3.5),
        "e.fp8": torch.randn(4, 8).to(torch.float8_e4m3fn),
        "f.empty": torch.zeros(0, 3),
    }


def test_streamed_shards_read_back_with_the_safetensors_library(tmp_path):
    tensors = _tensors()
    outs = [
        OutTensor(n, t.dtype, tuple(t.shape), (lambda t=t: [t[:2], t[2:]] if t.dim() and len(t) > 2 else [t]))
        for n, t in tensors.items()
    ]
    shards = plan_shards(outs, shard_bytes=600)
    assert len(shards) > 1
    for shard in shards:
        write_shard(tmp_path / shard.file_name, shard)
    write_index(tmp_path, shards)
    back = {}
    for shard in shards:
        back.update(load_file(tmp_path / shard.file_name))
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(_bytes(back[name]), _bytes(tensor)), name
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(index["weight_map"].values()) == {s.file_name for s in shards}


def test_reader_reads_library_files_whole_and_by_rows(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    source = SafetensorsDir(tmp_path)
    assert set(source.tensors) == set(tensors)
    for name, tensor in tensors.items():
        read = source.read(name)
        assert read.shape == tensor.shape and torch.equal(_bytes(read), _bytes(tensor)), name
    assert torch.equal(source.read_rows("a.weight", 3, 9), tensors["a.weight"][3:9])
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.metadata() == read_header(tmp_path / "model.safetensors")[1]


def _sharded_dir(tmp_path):
    save_file({"x": torch.ones(4, 4)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"y": torch.ones(8)}, tmp_path / "model-00002-of-00002.safetensors")
    index = {
        "metadata": {"total_size": 96},
        "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def test_missing_shard_is_named(tmp_path):
    _sharded_dir(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConvertError, match=r"names shard model-00002-of-00002.safetensors .* is missing"):
        SafetensorsDir(tmp_path)


def test_truncated_shard_is_named(tmp_path):
    _sharded_dir(tmp_path)
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(ConvertError, match=r"model-00001-of-00002.safetensors is truncated"):
        SafetensorsDir(tmp_path)
    shard.write_bytes(b"\x01\x02")
    with pytest.raises(ConvertError, match="truncated or not a safetensors file"):
        SafetensorsDir(tmp_path)


def test_index_naming_an_absent_tensor_is_refused(tmp_path):
    index = _sharded_dir(tmp_path)
    index["weight_map"]["z"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match=r"tensor 'z' is in model-00002-of-00002.safetensors, but that shard"):
        SafetensorsDir(tmp_path)


def test_pickle_weights_are_refused_with_the_fix(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ConvertError, match="pickle-based weights .* safe_serialization=True"):
        SafetensorsDir(tmp_path)
