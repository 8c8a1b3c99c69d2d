"""What makes verl 0.9.1's own ``main_ppo`` run on a machine without a GPU (opt-in, for tests and demos).

Importing this package or its modules changes nothing; :mod:`.activate` applies the harness, and verl
imports it in every process when ``VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.dev.cpu_harness.activate``.
"""
