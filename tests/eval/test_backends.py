"""The backends' rules that need no engine: vLLM's context length for HFLM's, and the SPD/TP refusal before vLLM."""

from __future__ import annotations

import pytest

from ladderize.errors import LadderizeError
from ladderize.eval.backends import EngineChoice, check_backend, vllm_max_model_len
from ladderize.records import EvalRecord
from tests.conftest import tiny_model


def test_vllm_context_is_hflms_plus_the_two_positions_lm_eval_keeps_free():
    assert vllm_max_model_len(512, 8192) == 514  # windows of 512 tokens, as HFLM's at --max-length 512
    assert vllm_max_model_len(None, 8192) == 8192  # the model's positions bound it (windows two tokens shorter)
    assert vllm_max_model_len(8191, 8192) == 8192
    assert vllm_max_model_len(None, None) is None


def test_an_spd_checkpoint_at_another_tp_is_refused_with_the_plugins_line(tmp_path):
    from ladderize.checkpoint.architectures import read_config_header

    path = tmp_path / "spd"
    tiny_model(layer_modes=["spd", "dense", "ladder", "ladder"], spd_tp_size=3).save_pretrained(path)
    header = read_config_header(path)
    with pytest.raises(LadderizeError) as caught:
        check_backend(EngineChoice(backend="vllm", tensor_parallel_size=1), header, "auto")
    assert str(caught.value) == ("ladderize: SPD layers 0:1 were converted for TP=3; at tensor_parallel_size=1 each rank "
                                 "would hold a different head group, which is a different model. Serve with "
                                 "tensor_parallel_size=3 (--tp 3)")
    with pytest.raises(LadderizeError, match="--backend vllm runs as one process"):
        check_backend(EngineChoice(backend="vllm", tensor_parallel_size=3), header, "auto", world=2)


def test_a_record_from_before_the_backends_reads_as_hflms():
    record = EvalRecord.from_json({"record": "ladderize-eval", "version": 2, "checkpoint": "/m", "layout": "dense",
                                   "layout_ranges": {}, "num_layers": 4, "layers_converted": 0,
                                   "allreduces_per_decode_step": 8, "overlappable_allreduces_per_decode_step": 0,
                                   "history": [], "results": {}})
    assert (record.backend, record.tensor_parallel_size, record.parallelize) == ("hf", 1, False)
