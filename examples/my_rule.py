"""A custom rule reward, in verl's compute_score signature (used by custom_rule_reward.py)."""


def politeness(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 when the answer says please or thanks, else 0.0."""
    return float(any(word in solution_str.lower() for word in ("please", "thank")))
