"""The TP runtime on CUDA at TP 1 against the HF model on the same GPU, in float32: greedy tokens equal and
teacher-forced logits within fp32 tolerance, for dense / ladder / SPD / hybrid layouts, eager, ``--cuda-graphs``,
``--compile`` and graphs + compile. Skipped (with the reason) where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch

from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
from ladderize.runtime.launch import LaunchSpec
from tests.runtime.runtime_helpers import case_overrides, hf_greedy, save_tiny, shape_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NEW_TOKENS = 12
PIECES = (7, 1, 1, 1, 1, 1)
MODES = {
    "eager": RuntimeOptions(dtype="float32"),
    "graphs": RuntimeOptions(dtype="float32", cuda_graphs=True),
    "compile": RuntimeOptions(dtype="float32", compile=True),
    "graphs+compile": RuntimeOptions(dtype="float32", cuda_graphs=True, compile=True),
}
LOGITS_ATOL = 1e-3  # fp32 on CUDA (TF32 off): measured at 04399e6 <= 8.2e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Per layout: the checkpoint, the HF model's greedy tokens and logits on CUDA."""
    torch.backends.cuda.matmul.allow_tf32 = False
    root = tmp_path_factory.mktemp("gpu-runtime")
    shape = shape_for(1)
    ids = torch.randint(3, shape["vocab_size"], (2, sum(PIECES)), generator=torch.Generator().manual_seed(0))
    out = {}
    for index, case in enumerate(("dense", "ladder", "spd", "hybrid")):
        path = root / case
        model = save_tiny(path, seed=index, **shape, **case_overrides(1)[case]).to("cuda")
        with torch.no_grad():
            logits = model(ids.cuda()).logits.float().cpu().numpy()
        tokens = hf_greedy(model, ids[:, :7].cuda(), NEW_TOKENS)
        assert len({t for row in tokens for t in row}) > 1, case  # the greedy output varies
        out[case] = (path, ids, tokens, logits)
    return out


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", ["dense", "ladder", "spd", "hybrid"])
def test_tp1_cuda_equals_hf_fp32(checkpoints, case, mode):
    path, ids, tokens, logits = checkpoints[case]
    rows = tuple(tuple(r) for r in ids.tolist())
    requests = [Request(str(path), tuple(r[:7] for r in rows), max_new_tokens=NEW_TOKENS),  # EOS handling as HF generate
                Request(str(path), rows, score_pieces=PIECES)]
    generated, scored = run_requests(requests, LaunchSpec(tp=1, device="cuda"), MODES[mode])
    assert generated.tokens == tokens, (case, mode)
    assert abs(scored.logits - logits).max() <= LOGITS_ATOL, (case, mode)
