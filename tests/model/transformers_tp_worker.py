"""One rank of ``test_transformers_tensor_parallel.py``: transformers' own tensor parallelism
(``from_pretrained(tp_plan="auto")``, gloo on CPU) on a ladder checkpoint, then on an SPD one.

Arguments: LADDER_DIR SPD_DIR IDS_FILE OUT_DIR. Each rank writes its ladder logits to OUT_DIR/logits-RANK.pt; rank 0
prints, as its last line, every rank's report in JSON: the local shapes of sharded weights, whether the head is still
tied, and the SPD load's exception as ``"Type: message"`` (None when it loaded).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import ladderize  # noqa: F401  (registers ladder_llama with the Auto classes)

ladder_dir, spd_dir, ids_file, out_dir = sys.argv[1:5]
model = AutoModelForCausalLM.from_pretrained(ladder_dir, tp_plan="auto").eval()
rank = dist.get_rank()
with torch.no_grad():
    torch.save(model(torch.load(ids_file)).logits, Path(out_dir) / f"logits-{rank}.pt")
weights = {"q_proj": model.model.layers[0].self_attn.q_proj.weight, "lm_head": model.lm_head.weight,
           "embed_tokens": model.model.embed_tokens.weight}
report = {"local_rows": {name: weight.to_local().shape[0] for name, weight in weights.items()},
          "tied": model.lm_head.weight is model.model.embed_tokens.weight}
try:
    AutoModelForCausalLM.from_pretrained(spd_dir, tp_plan="auto")
    report["spd"] = None
except Exception as exc:  # noqa: BLE001  (the test reads which exception, and its message)
    report["spd"] = f"{type(exc).__name__}: {exc}"
reports = [None] * dist.get_world_size()
dist.all_gather_object(reports, report)  # the group still works after the refusal
if rank == 0:
    print(json.dumps(reports))
dist.destroy_process_group()
