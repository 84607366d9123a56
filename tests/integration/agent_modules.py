"""The agent, which on its way out writes the name of every module it loaded to ``$DUMP``:
what tests/integration/test_agent.py checks against what the agent was trimmed of (run as
``python -m tests.integration.agent_modules``)."""

from __future__ import annotations

import atexit
import json
import os
import sys

from agent import __main__ as agent


def _dump() -> None:
    with open(os.environ["DUMP"], "w", encoding="utf-8") as f:
        json.dump(sorted(sys.modules), f)


atexit.register(_dump)

if __name__ == "__main__":
    agent.main()
