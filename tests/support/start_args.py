"""What the server's start-up makes of command lines before the engine loads, in one server-side interpreter
(one vLLM import for many cases): each case gives ``["exit", message]`` when ``apply_reward_defaults`` refuses it,
else the values of the requested ``args`` expressions."""

from __future__ import annotations

import json
import subprocess
from typing import Sequence

from verl_vllm_rm.replicas.launcher import find_server_python

SCRIPT = """
import json, os, sys
from verl_vllm_rm.server.entry import apply_reward_defaults, build_parser

def put(env):  # None: unset
    for name, value in env.items():
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)

cases, reads, envs = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = []
for argv, env in zip(cases, envs):
    saved = {name: os.environ.get(name) for name in env}
    put(env)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        apply_reward_defaults(args, parser)
    except SystemExit as e:
        out.append(["exit", str(e)])
        continue
    else:
        out.append([eval(expression, {"args": args}) for expression in reads])
    finally:
        put(saved)
print(json.dumps(out))
"""


def before_the_engine(cases: Sequence[Sequence[str]], reads: Sequence[str],
                      envs: Sequence[dict[str, str | None]] | None = None) -> tuple[list, str]:
    """(one result per case, the interpreter's stderr); ``reads`` are Python expressions over ``args``; ``envs``
    gives each case the environment variables it runs with (None: unset)."""
    envs = [{}] * len(cases) if envs is None else list(envs)
    assert len(envs) == len(cases), (len(envs), len(cases))
    proc = subprocess.run([find_server_python(), "-c", SCRIPT, json.dumps([list(c) for c in cases]),
                           json.dumps(list(reads)), json.dumps(envs)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
