"""The ``vllm_rm`` reward manager verl's reward loop calls: its options, the row queue that scores the rows of one
loop iteration together, the orchestration that routes each sample to its reward models, judge, rules and verl's
``compute_score``, and the ``reward_extra_info`` it reports per sample."""
