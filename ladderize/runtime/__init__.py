"""The bundled tensor-parallel runtime: sharding, communication plans, prefill/decode, benchmarks.

Modules: ``plan`` (which all-reduce is blocking or overlapped, per ``LayerMode`` and
schedule), ``sharding`` (per-rank weight slices), ``allreduce`` (counted all-reduce
wrappers), ``engine`` (the per-rank model, KV cache, decode loop), ``launch`` (spawn or
torchrun, gloo or NCCL), ``generate`` and ``bench`` (the CLI's entry points).
"""
