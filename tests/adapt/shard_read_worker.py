"""Run by tests/adapt/test_sharded.py under torchrun (3 CPU processes, gloo): the sharded model's decoder layers are
read row-wise, each rank its own rows of each tensor; prints one JSON line per rank: the bytes of layer tensors it
read, the layer tensors it read whole, and whether its shards equal the checkpoint's rows."""

import json
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import ladderize.adapt.layers.layer_source as layer_source
import ladderize.adapt.train.sharded as sharded
from ladderize.model import LadderLlamaConfig

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
path = sys.argv[1]
read_bytes: dict[str, int] = {}
whole: list[str] = []
read_rows, read_tensors = sharded._read_rows, layer_source.read_tensors


def counting_rows(file, name, rows):
    tensor = read_rows(file, name, rows)
    read_bytes[name] = read_bytes.get(name, 0) + tensor.numel() * tensor.element_size()
    return tensor


sharded._read_rows = counting_rows
layer_source.read_tensors = lambda names: whole.extend(names) or read_tensors(names)
config = LadderLlamaConfig.from_pretrained(path)
model = sharded._sharded_model(config, path, torch.float32, torch.device("cpu"), trained={2, 3})
full = load_file(f"{path}/model.safetensors")
equal = True
for name, tensor in model.state_dict().items():
    if name.startswith("model.layers."):
        rows = sharded._rows(tensor.shape[0], rank, world)
        equal &= torch.equal(tensor.to_local(), full[name][rows])
layer_bytes = {name: count for name, count in read_bytes.items() if name.startswith("model.layers.")}
report = {"rank": rank, "world": world, "layer_bytes": sum(layer_bytes.values()),
          "full_layer_bytes": sum(t.numel() * t.element_size() for n, t in full.items() if n.startswith("model.layers.")),
          "whole_layer_reads": [n for n in whole if n.startswith("model.layers.")], "equal": bool(equal)}
sys.stdout.write(json.dumps(report) + "\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
