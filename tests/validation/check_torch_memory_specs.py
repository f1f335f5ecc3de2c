"""The committed model specs of the harness (scripts/torch_memory/models/*.json) are what this build's
`fsdpsim model-info --json` prints: the GPU machine, which has no fsdpsim build, builds exactly fsdpsim's
models. A stale copy fails, naming the model and the key; refresh with
`scripts/torch_memory_reference.py refresh-models --fsdpsim build/fsdpsim`."""
import json
import os
import sys

import torch_memory_test_util  # noqa: F401 (sets sys.path)
from torch_memory import specs


def main(fsdpsim):
    stale = []
    for name in specs.MODELS:
        want = specs.model_info_subset(specs.run_model_info(fsdpsim, name))
        with open(os.path.join(specs.MODELS_DIR, f"{name}.json"), encoding="utf-8") as f:
            have = json.load(f)
        for key in sorted(set(want) | set(have)):
            if want.get(key) != have.get(key):
                stale.append(f"{name}.json: {key} differs from `fsdpsim model-info --model {name} --json`")
    for line in stale:
        print(line)
    if stale:
        print("refresh: scripts/torch_memory_reference.py refresh-models --fsdpsim build/fsdpsim")
        return 1
    print(f"{len(specs.MODELS)} model specs match fsdpsim model-info")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
