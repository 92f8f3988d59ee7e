"""Serving converted checkpoints in inference engines.

``vllm_plugin`` is the ``vllm.general_plugins`` entry point of the ``ladderize[vllm]`` extra
(cheap: it imports no vLLM model code); ``vllm_model`` is the vLLM model itself, whose layer
loop runs ``Layout.program()``; ``check`` is a small driver that prints vLLM's greedy tokens
and log-probs as JSON (the tests and the benchmark run it inside ``.venv-vllm``).
"""
