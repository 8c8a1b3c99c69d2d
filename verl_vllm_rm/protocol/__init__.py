"""What the trainer side and the server agree on, importing neither verl nor vllm: the ``/score`` schema, error
bodies, strict JSON bodies, training modes and parameter names, the parameter inventory, LoRA on the wire, the
tensor plane's process group and bucket layout, and the server's command line read raw."""
