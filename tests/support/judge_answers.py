"""What a listwise judge itself saw and answered, read from the chat requests a recording proxy
(:class:`fault_proxy.FaultProxy`, no faults set) passed to it: an independent account of each group's
ranking, to check every member's ``judge_rank`` against (plain functions)."""

from __future__ import annotations

import json
import re
from collections import defaultdict

#: the default listwise template's numbered responses (``rewards/judge.py``): "# Response i\n<text>"
RESPONSE_BLOCK = re.compile(r"# Response (\d+)\n(.*?)(?=\n\n# Response \d+\n|\n\nAnswer with JSON)", re.DOTALL)


def judged_groups(requests: list[dict]) -> list[dict[str, list[int]]]:
    """One entry per listwise judgement: each response text the judge was shown, with the rank(s) (0 = best) the
    judge's own answer gave it (a text shown twice has two)."""
    groups = []
    for record in requests:
        if record["path"] != "/v1/chat/completions" or "answer" not in record:
            continue
        prompt = json.loads(record["body"])["messages"][-1]["content"]
        ranking = json.loads(json.loads(record["answer"])["choices"][0]["message"]["content"])["ranking"]
        ranks: dict[str, list[int]] = defaultdict(list)
        for number, text in RESPONSE_BLOCK.findall(prompt):
            ranks[text].append(ranking.index(int(number)))
        groups.append({text: sorted(r) for text, r in ranks.items()})
    return groups


def assert_ranks_are_the_judges(members: list[tuple[str, float]], requests: list[dict]) -> None:
    """``members``: one group's (response text, judge_rank) pairs. The group is one of the judgements the proxy saw
    (same responses), and each response's rank is the one the judge gave that response (for a text shown more than
    once, the same ranks between them)."""
    ranks: dict[str, list[int]] = defaultdict(list)
    for text, rank in members:
        ranks[text].append(int(rank))
    mine = {text: sorted(r) for text, r in ranks.items()}
    matching = [g for g in judged_groups(requests) if set(g) == set(mine)]
    assert matching, f"no judgement showed the judge exactly these responses: {sorted(mine)[:2]}..."
    assert mine in matching, (mine, matching)
