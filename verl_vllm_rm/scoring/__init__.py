"""The ``vllm_rm`` reward manager verl's reward loop calls: its options, the row queue that scores the rows of one
loop iteration together, and the one scoring pipeline: each row routed by its ``data_source``, every scorer (the
reward models, the rules, verl's ``compute_score``, the judge) answering the whole list of rows at once, the
route's composition combining their columns into each row's reward and ``reward_extra_info``."""
