"""Ground truth for fsdpsim's memory model from PyTorch itself (issue 19).

The harness builds a model from fsdpsim's ModelSpec in one of the frameworks' implementation
recipes, applies FSDP1 or FSDP2 with a plan's settings, emulates a world of W ranks on one GPU with
PyTorch's fake process group, runs a few training steps and writes one small JSON fixture per case
(tests/fixtures/torch_memory/<case>.json) that the CTest test_torch_memory_fixtures compares with
the simulator.

Modules that need PyTorch (recipes/, parallel, train) import it lazily; everything else (plan
checking, the matrix, the time estimate, the snapshot reduction, the fixture writer) is plain
Python and tested without PyTorch by tests/validation/.
"""
