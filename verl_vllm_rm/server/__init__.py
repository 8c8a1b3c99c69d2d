"""The reward-model server: vLLM's OpenAI-compatible app plus reward routes.

Only this sub-package imports vllm. Start it with ``python -m verl_vllm_rm.server``.
"""
