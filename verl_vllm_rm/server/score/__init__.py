"""The reward routes added to vLLM's app (``/health``, ``/score``, ``/runtime_version``, ``/get_world_size``) and the
scoring behind ``/score``: what the engine is asked for each served head and how its answer becomes a reward."""
