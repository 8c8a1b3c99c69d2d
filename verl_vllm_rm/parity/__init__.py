"""Whether the server scores like the trainer's model: reference scores from transformers, the refit parity probe
run after publishes, embedding health, and ``verl-vllm-rm check`` on a live server."""
