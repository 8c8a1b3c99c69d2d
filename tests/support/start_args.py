"""What the server's start-up makes of command lines before the engine loads, in one server-side interpreter
(one vLLM import for many cases): each case gives ``["exit", message]`` when ``apply_reward_defaults`` refuses it,
else the values of the requested ``args`` expressions."""

from __future__ import annotations

import json
import subprocess
from typing import Sequence

from verl_vllm_rm.replicas.launcher import find_server_python

SCRIPT = """
import json, sys
from verl_vllm_rm.server.entry import apply_reward_defaults, build_parser

cases, reads = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for argv in cases:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        apply_reward_defaults(args, parser)
    except SystemExit as e:
        out.append(["exit", str(e)])
        continue
    out.append([eval(expression, {"args": args}) for expression in reads])
print(json.dumps(out))
"""


def before_the_engine(cases: Sequence[Sequence[str]], reads: Sequence[str]) -> tuple[list, str]:
    """(one result per case, the interpreter's stderr); ``reads`` are Python expressions over ``args``."""
    proc = subprocess.run([find_server_python(), "-c", SCRIPT, json.dumps([list(c) for c in cases]),
                           json.dumps(list(reads))], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
