"""`broker run` with the bench.noop effect registered: broker.hosting.runner.run, as the
CLI calls it.

    python -m bench.sandbox_run SPEC_JSON CMD ...

SPEC: {"state": dir, "exports": dir, "workspace": dir}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.handlers import Noop
from broker.config import Config
from broker.hosting.runner import RunOptions, run
from broker.policy.ruleset import Policy
from broker.registry import Registry


def main() -> int:
    spec = json.loads(sys.argv[1])
    registry = Registry()
    registry.load_entry_points()
    registry.register(Noop(), "bench")
    config = Config(
        state_dir=Path(spec["state"]), integrations={"files": {"root": spec["exports"]}}
    )
    registry.check_config(config.integrations, config.base_dir)
    options = RunOptions(
        command=sys.argv[2:], workspace=Path(spec["workspace"]), say=lambda s: print(s)
    )
    policy = Policy()
    return run(config, lambda: (registry, policy), options)


if __name__ == "__main__":
    sys.exit(main())
