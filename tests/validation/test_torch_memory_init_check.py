"""The harness's end-of-init memory check (scripts/torch_memory/init_check.py) and the param_init_fn that
must not keep FSDP1's original parameters alive (parallel.make_param_init_fn).

The accounting and the comparison are plain Python and run everywhere. Where some PyTorch is installed
(python3-torch on the CPU is enough) the param_init_fn is run on meta modules and the storage walk on CPU
tensors; without it those tests are skipped. Not here: FSDP itself and CUDA memory (the GPU machine's run).
"""
import types
import unittest
import weakref

import torch_memory_test_util  # noqa: F401 (sets sys.path)

from torch_memory import init_check

try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None

GIB = 2**30


class AccountTest(unittest.TestCase):
    def test_each_storage_once_rounded_as_the_allocator_rounds(self):
        self.assertEqual(init_check.account([(1, 1000), (1, 1000), (2, 512), (3, 0)]), 1024 + 512)
        self.assertEqual(init_check.account([(1, 1)]), 512)
        self.assertEqual(init_check.account([]), 0)

    def test_a_storage_seen_through_a_smaller_view_keeps_its_size(self):
        self.assertEqual(init_check.account([(7, 4096), (7, 512)]), 4096)


class CompareTest(unittest.TestCase):
    def test_within_the_margin_either_way(self):
        expected = int(0.58 * GIB)
        for allocated in (expected, expected + 2**20, expected - 2**20):
            check = init_check.compare(allocated, expected)
            self.assertTrue(check["ok"], check)
            self.assertIsNone(init_check.note(check))

    def test_the_2026_11_26_fsdp1_lora_leak_is_caught(self):
        # l1b-fsdp1-lora-r16-qkv-hf: 5.205 GiB allocated at the end of init; the sharded state of the
        # other l1b cases at world 8 is ~0.58 GiB
        check = init_check.compare(int(5.205 * GIB), int(0.58 * GIB))
        self.assertFalse(check["ok"])
        text = init_check.note(check)
        self.assertIn("FAILED", text)
        self.assertIn("5.205 GiB allocated", text)
        self.assertIn("unsharded original parameter", text)

    def test_fsdp1s_unexplained_16_mib_passes_even_on_a_tiny_shard(self):
        # l1b-fsdp1-w8-hf and -hybrid-w64-hf on the H200: 15.97 MiB above the walk, whatever the world
        for expected in (int(0.5755 * GIB), 8 * 2**20):
            self.assertTrue(init_check.compare(expected + int(15.97 * 2**20), expected)["ok"])

    def test_one_leaked_llama_1b_mlp_weight_is_caught(self):
        check = init_check.compare(int(0.58 * GIB) + 64 * 2**20, int(0.58 * GIB))
        self.assertFalse(check["ok"], check)

    def test_less_than_expected_is_reported_too(self):
        check = init_check.compare(int(0.2 * GIB), int(0.58 * GIB))
        self.assertFalse(check["ok"])
        self.assertIn("missed", init_check.note(check))

    def test_a_walk_that_failed_says_so(self):
        self.assertIn("not done", init_check.note({"ok": None, "error": "AttributeError: x"}))
        self.assertIsNone(init_check.note(None))


class FakeStorage:
    def __init__(self, ptr, nbytes):
        self.ptr, self.n = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n


class FakeTensor:
    def __init__(self, device, ptr, nbytes):
        self.device = types.SimpleNamespace(type=device)
        self.storage_ = FakeStorage(ptr, nbytes)

    def untyped_storage(self):
        return self.storage_


class WalkWithoutTorchTest(unittest.TestCase):
    def test_cuda_storages_skips_other_devices_and_non_tensors(self):
        tensors = [FakeTensor("cuda", 1, 4096), FakeTensor("cpu", 2, 4096), None, "hf", FakeTensor("cuda", 1, 4096)]
        self.assertEqual(init_check.cuda_storages(tensors), [(1, 4096), (1, 4096)])

    def test_tensor_subclasses_are_seen_through_their_inner_tensors(self):
        # torchao's NF4Tensor (quantized_scalers, quantization_factor, quantized_data, ...) and its low-bit
        # optimizer states are wrapper subclasses: no storage of their own, __tensor_flatten__ names the inner
        # tensors; a DTensor's local shard may itself be one.
        class Wrapper:
            device = types.SimpleNamespace(type="cuda")

            def __init__(self, **inner):
                self.__dict__.update(inner)
                self.names = list(inner)

            def __tensor_flatten__(self):
                return self.names, None

            def untyped_storage(self):
                raise RuntimeError("a wrapper subclass has no storage")

        class DTensorLike:
            def __init__(self, local):
                self.local = local

            def to_local(self):
                return self.local

        nf4 = Wrapper(quantized_data=FakeTensor("cuda", 1, 1024), quantized_scalers=FakeTensor("cuda", 2, 32),
                      quantization_factor=FakeTensor("cuda", 3, 2))
        nested = Wrapper(codes=FakeTensor("cuda", 4, 256), scale=Wrapper(inner=FakeTensor("cuda", 5, 4)))
        self.assertEqual(init_check.cuda_storages([DTensorLike(nf4), nested]),
                         [(1, 1024), (2, 32), (3, 2), (4, 256), (5, 4)])
        self.assertEqual(init_check.account(init_check.cuda_storages([nf4])), 1024 + 512 + 512)

    def test_harness_tensors_takes_the_rope_tables_and_the_batches(self):
        a, b, tok = FakeTensor("cuda", 1, 8), FakeTensor("cuda", 2, 8), FakeTensor("cuda", 3, 8)
        self.assertEqual(init_check.harness_tensors(types.SimpleNamespace(rope=("hf", a)), tok), [a, tok])
        self.assertEqual(init_check.harness_tensors(types.SimpleNamespace(rope=(a, b)), tok), [a, b, tok])
        self.assertEqual(init_check.harness_tensors(types.SimpleNamespace(), tok), [tok])


@unittest.skipIf(torch is None, "PyTorch is not installed (python3-torch)")
class ParamInitFnTest(unittest.TestCase):
    def _model(self):
        m = nn.Module()
        m.emb = nn.Embedding(64, 16, device="meta")
        m.head = nn.Linear(16, 64, bias=False, device="meta")
        m.head.weight = m.emb.weight          # tied, as the recipes tie the LM head
        m.norm = nn.LayerNorm(16, device="meta")
        return m

    def _materialize(self, fn, m):
        for module in m.modules():          # FSDP1 _materialize_with_param_init_fn: once per module of the unit
            fn(module)

    def test_materializes_initializes_and_keeps_the_tie(self):
        from torch_memory import parallel
        m = self._model()
        self._materialize(parallel.make_param_init_fn(torch.device("cpu")), m)
        self.assertFalse(any(p.is_meta for p in m.parameters()))
        self.assertIs(m.head.weight, m.emb.weight)
        self.assertTrue(torch.all(m.norm.weight == 1) and torch.all(m.norm.bias == 0))

    def test_holds_no_parameter_once_the_module_lets_it_go(self):
        # FSDP1 with use_orig_params=False swaps each module's parameter for a plain tensor view into the
        # FlatParameter (FlatParamHandle._use_unsharded_views(as_params=False)) and never touches the
        # nn.Parameter objects: whatever still references them keeps their unsharded storage alive.
        from torch_memory import parallel
        m = self._model()
        fn = parallel.make_param_init_fn(torch.device("cpu"))
        self._materialize(fn, m)
        refs = [weakref.ref(p) for p in m.parameters()]
        flat = torch.cat([p.detach().flatten() for p in m.parameters()])
        for module in (m.emb, m.head, m.norm):
            for name, p in list(module.named_parameters(recurse=False)):
                delattr(module, name)
                setattr(module, name, flat[:p.numel()].view(p.shape))
        del p
        self.assertEqual([r() for r in refs if r() is not None], [], "param_init_fn (alive) still holds a parameter")
        fn.release()
        fn(m.emb)                           # after release: nothing left to materialize, nothing remembered

    def test_storage_walk_counts_views_of_one_flat_tensor_once(self):
        m = nn.Module()
        flat = nn.Parameter(torch.zeros(1000))
        m.register_parameter("flat", flat)
        m.register_buffer("buf", torch.zeros(10))
        views = [flat.detach()[:400], flat.detach()[400:]]
        tensors = init_check.model_tensors(m) + views + [None]
        want = -(-1000 * 4 // 512) * 512 + 512
        self.assertEqual(init_check.account(init_check.cuda_storages(tensors, device="cpu")), want)


if __name__ == "__main__":
    unittest.main()
