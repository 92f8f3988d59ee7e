"""The bundled tensor-parallel runtime: sharding, communication plans, prefill/decode, benchmarks.

Modules: ``plan`` (which all-reduce is blocking or overlapped, per ``LayerMode`` and
schedule), ``dims`` (a config's shape numbers, TP validation), ``sharding`` (which slices a
rank owns, read from safetensors), ``weights`` (a rank's fused weights), ``allreduce``
(counted all-reduce wrappers), ``engine`` (the per-rank model, on ``model/block.py``'s math),
``state`` (rotary table, KV cache, residual stream), ``decode`` (prefill, decode, sampling),
``kernels`` (gemv/oneDNN/aten linears), ``launch`` (spawn or torchrun, gloo or NCCL),
``generate`` and ``bench`` (the CLI's entry points).
"""
