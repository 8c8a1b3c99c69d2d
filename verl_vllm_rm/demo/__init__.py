"""``make demo`` / ``verl-vllm-rm demo``: the whole product on CPU in a few minutes."""
