"""plan.lora in the torch-memory harness (scripts/torch_memory/lora.py), without PyTorch: which modules of
each recipe get adapters, their shapes, the trainable count against the simulator's, and the plans the
harness refuses. With FSDPSIM_BINARY set (CTest sets it), the counts are also read back from the simulator
itself: its sharded parameters on one GPU grow by 4 bytes per adapter parameter (fp32 master weights)."""
import json
import os
import subprocess
import tempfile
import unittest

import torch_memory_test_util  # noqa: F401 (sets sys.path)
from torch_memory import estimate, lora as loras, matrix as matrices, plan as plans, specs, train
from torch_memory.common import InputError


def spec_of(name):
    return specs.load_model_info(name)["model"]


def parsed(lora, **plan):
    return plans.parse_plan({**plan, "lora": lora})


def adapters(model, implementation, targets, rank=16):
    return loras.block_adapters(spec_of(model), implementation, parsed({"rank": rank, "targets": targets}).lora)


# The simulator's own figures: reports/validation/devset-memory-2026-11-26-agstate.txt ("LoRA r16 on
# ["q","k","v"]: 44564480 trainable parameters" for llama3-70b as torchtune builds it; "LoRA r8 on
# ["q","v"]: 4194304" for Llama-2-7B in litgpt), and `fsdpsim simulate` on 1xH100-SXM for the zoo models
# the harness builds (sharded_params with the adapters less without, / 4 bytes).
LLAMA3_70B = {"model_type": "llama", "mlp": "swiglu", "n_experts": 0, "hidden": 8192, "n_heads": 64, "n_kv_heads": 8,
              "head_dim": 128, "ffn_hidden": 28672, "n_layers": 80, "vocab_size": 128256}
LLAMA2_7B = {"model_type": "llama", "mlp": "swiglu", "n_experts": 0, "hidden": 4096, "n_heads": 32, "n_kv_heads": 32,
             "head_dim": 128, "ffn_hidden": 11008, "n_layers": 32, "vocab_size": 32000}
SIMULATOR_COUNTS = [
    ("llama-1b", "torchtitan", ["q", "k", "v"], 2359296),
    ("llama-1b", "hf", ["q", "k", "v"], 2359296),
    ("llama-1b", "litgpt", ["q", "k", "v"], 2359296),
    ("llama-1b", "litgpt", ["q", "v"], 1703936),
    ("llama-1b", "fused", ["q", "k", "v", "o", "mlp", "head"], 13357056),
    ("llama-1b", "torchtitan", ["q", "o", "mlp", "head"], 12046336),
    ("llama-1b", "litgpt", ["k", "o", "down", "head"], 6410240),
    ("llama3-8b", "hf", ["q", "v"], 6815744),
    ("gpt2", "hf", ["q", "o", "up", "down", "head"], 3175696),
    ("gpt2", "fused", ["v"], 589824),
    ("tiny-llama", "litgpt", ["q", "k", "v", "o", "mlp", "head"], 365568),
]


class Adapters(unittest.TestCase):
    def test_separate_projections_get_one_pair_each(self):
        got = adapters("llama-1b", "hf", ["q", "k", "v"])
        self.assertEqual([(e["kind"], e["module"], e["a"], e["b"]) for e in got],
                         [("linear", "self_attn.q_proj", (16, 2048), (2048, 16)),
                          ("linear", "self_attn.k_proj", (16, 2048), (512, 16)),
                          ("linear", "self_attn.v_proj", (16, 2048), (512, 16))])
        self.assertEqual([e["module"] for e in adapters("llama-1b", "fused", ["v", "o", "mlp"])],
                         ["self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])

    def test_torchtitan_adapts_each_projection(self):
        # torchtitan's stock attention has wq, wk, wv (the simulator's recipe too: block_matrices Q, K, V): one
        # pair beside each targeted projection, as on Hugging Face's
        self.assertEqual(adapters("llama-1b", "torchtitan", ["q", "k", "v"]), adapters("llama-1b", "hf", ["q", "k", "v"]))
        self.assertEqual([e["module"] for e in adapters("llama-1b", "torchtitan", ["q"])], ["self_attn.q_proj"])

    def test_litgpt_groups_the_enabled_parts(self):
        (e,) = adapters("llama-1b", "litgpt", ["q", "v"], rank=8)
        self.assertEqual((e["kind"], e["module"], e["a"], e["b"]), ("qkv_parts", "self_attn.qkv", (16, 2048), (2560, 8)))
        self.assertEqual(e["parts"], [("q", 2048), ("v", 512)])
        self.assertEqual([x["module"] for x in adapters("llama-1b", "litgpt", ["o", "down"])], ["self_attn.proj", "mlp.down_proj"])

    def test_gpt2_conv1d_modules(self):
        got = adapters("gpt2", "hf", ["k", "o", "up", "down"], rank=4)
        self.assertEqual([(e["module"], e["base"], e["a"], e["b"]) for e in got],
                         [("attn.c_attn", "QKV", (4, 768), (2304, 4)), ("attn.c_proj", "Out", (4, 768), (768, 4)),
                          ("mlp.c_fc", "Fc", (4, 768), (3072, 4)), ("mlp.c_proj", "Down", (4, 3072), (768, 4))])

    def test_head(self):
        lora = parsed({"rank": 8, "targets": ["head"]}).lora
        self.assertEqual(loras.block_adapters(spec_of("llama-1b"), "hf", lora), [])
        (e,) = loras.head_adapters(spec_of("llama-1b"), lora)
        self.assertEqual((e["module"], e["a"], e["b"]), ("lm_head", (8, 2048), (128256, 8)))
        self.assertEqual(loras.head_adapters(spec_of("llama-1b"), parsed({"rank": 8, "targets": ["q"]}).lora), [])


class TrainableCounts(unittest.TestCase):
    def test_published_counts(self):
        qkv = parsed({"rank": 16, "targets": ["q", "k", "v"]}).lora
        self.assertEqual(loras.trainable_params(LLAMA3_70B, "hf", qkv), 44564480)
        qv = parsed({"rank": 8, "targets": ["q", "v"]}).lora
        self.assertEqual(loras.trainable_params(LLAMA2_7B, "litgpt", qv), 4194304)

    def test_simulator_counts(self):
        for model, implementation, targets, count in SIMULATOR_COUNTS:
            with self.subTest(model=model, implementation=implementation, targets=targets):
                lora = parsed({"rank": 16, "targets": targets}).lora
                self.assertEqual(loras.trainable_params(spec_of(model), implementation, lora), count)

    @unittest.skipUnless(os.path.isfile(os.environ.get("FSDPSIM_BINARY", "")), "FSDPSIM_BINARY: no fsdpsim binary")
    def test_against_the_simulator_binary(self):
        binary = os.environ["FSDPSIM_BINARY"]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")

            def sharded(model, plan):
                subprocess.run([binary, "simulate", "--model", model, "--cluster", "1xH100-SXM", "--plan", json.dumps(plan),
                                "--json", out], check=True, capture_output=True)
                with open(out, encoding="utf-8") as f:
                    return json.load(f)["result"]["memory_breakdown_bytes"]["sharded_params"]

            for model, implementation, targets, _ in SIMULATOR_COUNTS[:3] + SIMULATOR_COUNTS[4:5] + SIMULATOR_COUNTS[8:9]:
                with self.subTest(model=model, implementation=implementation, targets=targets):
                    plan = {"fsdp_version": 2, "implementation": implementation, "seq_len": 256}
                    lora = {"rank": 16, "targets": targets}
                    grown = sharded(model, {**plan, "lora": lora}) - sharded(model, plan)
                    self.assertEqual(grown, 4 * loras.trainable_params(spec_of(model), implementation, parsed(lora).lora))

    def test_the_run_expects_base_plus_adapters(self):
        info = specs.load_model_info("llama-1b")
        p = plans.resolve_plan({"lora": {"rank": 16, "targets": ["q", "k", "v"]}}, 8, 8, info["units"])
        self.assertEqual(train.expected_params(info, p), (info["params_total"] + 2359296, 2359296))
        p = plans.resolve_plan({"lora": {"rank": 16, "targets": ["q"]}, "frozen_units": ["last_block"]}, 8, 8, info["units"])
        self.assertEqual(train.expected_params(info, p)[1], None)
        self.assertEqual(train.expected_params(info, plans.resolve_plan({}, 8, 8)), (info["params_total"], None))

    def test_estimate_counts_the_adapters_only(self):
        info = specs.load_model_info("llama3-8b")
        full = estimate.estimate_case_seconds(info, plans.resolve_plan({}, 8, 8), 8, 3)
        lora = estimate.estimate_case_seconds(info, plans.resolve_plan({"lora": {"rank": 8, "targets": ["q"]}}, 8, 8), 8, 3)
        self.assertLess(lora["step_s"], full["step_s"])


class Refusals(unittest.TestCase):
    def assertRefused(self, model, plan, field, world=8):
        p = plans.resolve_plan(plan, world, 8)
        with self.assertRaises(InputError) as cm:
            loras.check_model(spec_of(model), p)
        self.assertEqual(cm.exception.field, field, str(cm.exception))

    def accepted(self, model, plan):
        loras.check_model(spec_of(model), plans.resolve_plan(plan, 8, 8))

    def test_the_simulators_model_rules(self):
        # program/lower_context.cpp lora_shape
        self.assertRefused("gpt2", {"lora": {"rank": 8, "targets": ["gate"]}}, "plan.lora.targets")
        self.assertRefused("gpt2", {"lora": {"rank": 8, "targets": ["mlp"]}}, "plan.lora.targets")
        self.accepted("gpt2", {"lora": {"rank": 8, "targets": ["up", "down"]}})
        self.assertRefused("tiny-llama", {"lora": {"rank": 257, "targets": ["q"]}}, "plan.lora.rank")
        self.accepted("tiny-llama", {"lora": {"rank": 128, "targets": ["q"]}})   # min(hidden 256, 32 x 4 kv heads)
        self.assertRefused("tiny-llama", {"lora": {"rank": 129, "targets": ["q"]}}, "plan.lora.rank")

    def test_what_the_harness_does_not_build(self):
        self.assertRefused("llama-1b", {"lora": {"rank": 8, "targets": ["head"]}, "cross_entropy": "fused_linear"},
                           "plan.lora.targets")
        self.accepted("llama-1b", {"lora": {"rank": 8, "targets": ["q"]}, "cross_entropy": "fused_linear"})
        no_orig = {"fsdp_version": 1, "use_orig_params": False}
        self.accepted("llama-1b", {**no_orig, "lora": {"rank": 8, "targets": ["q", "k", "v", "o", "mlp"]}})
        self.assertRefused("llama-1b", {**no_orig, "lora": {"rank": 8, "targets": ["q", "head"]}}, "plan.lora.targets")
        self.assertRefused("llama-1b", {**no_orig, "auto_wrap_policy": "none", "lora": {"rank": 8, "targets": ["q"]}},
                           "plan.auto_wrap_policy")
        self.accepted("llama-1b", {"fsdp_version": 1, "lora": {"rank": 8, "targets": ["q", "head"]}})
        self.accepted("llama-1b", {"auto_wrap_policy": "none", "lora": {"rank": 8, "targets": ["q", "head"]}})
        loras.check_model(spec_of("llama-1b"), plans.resolve_plan({}, 8, 8))   # no lora: nothing to check

    def test_qlora_rules(self):
        nf4 = {"rank": 8, "targets": ["q", "v"], "quantize_base": "nf4"}
        pure = {"param_dtype": "bf16", "master_weights_dtype": "bf16", "lora": nf4}
        self.accepted("llama-1b", pure)
        self.accepted("llama3-8b", pure)
        field = "plan.lora.quantize_base"
        self.assertRefused("llama-1b", {**pure, "fsdp_version": 1}, field)             # bitsandbytes' layout
        self.assertRefused("llama-1b", {**pure, "master_weights_dtype": "fp32"}, field)  # the simulator's rule
        self.assertRefused("llama-1b", {**pure, "cpu_offload": True}, field)
        self.assertRefused("llama-1b", {**pure, "implementation": "litgpt"}, field)      # fused qkv
        self.assertRefused("gpt2", {**pure, "lora": {**nf4, "targets": ["up"]}}, field)  # Conv1D, biases
        # llama-1b's k projection is 512 x 2048: 1,048,576 elements, 64 NF4 blocks of 16,384; 128 shards
        # leave 8,192 elements each (torchao's nf4_split asserts), 512 shards split 512 rows one each but
        # 2,048 elements
        loras.check_model(spec_of("llama-1b"), plans.resolve_plan(pure, 64, 8))
        p = plans.resolve_plan(pure, 128, 8)
        with self.assertRaises(InputError) as cm:
            loras.check_model(spec_of("llama-1b"), p)
        self.assertIn("16384", str(cm.exception))

    def test_torchao_is_needed_by_its_optimizers_and_qlora_alone(self):
        self.assertTrue(train.needs_torchao(plans.parse_plan({"optimizer": "torchao_adamw8bit"})))
        self.assertTrue(train.needs_torchao(plans.parse_plan({"lora": {"rank": 8, "targets": ["q"], "quantize_base": "nf4"}})))
        self.assertFalse(train.needs_torchao(plans.parse_plan({"lora": {"rank": 8, "targets": ["q"]}})))
        self.assertFalse(train.needs_torchao(plans.parse_plan({})))
        # without torchao (none here, FSDPSIM_TORCHAO_PATH unset): refused naming the plan's field
        saved = os.environ.pop("FSDPSIM_TORCHAO_PATH", None)
        try:
            import importlib.util
            if importlib.util.find_spec("torchao") is None:
                for plan, field in (({"optimizer": "torchao_adamw4bit"}, "plan.optimizer"),
                                    ({"lora": {"rank": 8, "targets": ["q"], "quantize_base": "nf4"}}, "plan.lora.quantize_base")):
                    with self.assertRaises(InputError) as cm:
                        train.import_torchao(plans.parse_plan(plan))
                    self.assertEqual(cm.exception.field, field)
        finally:
            if saved is not None:
                os.environ["FSDPSIM_TORCHAO_PATH"] = saved


class Matrix(unittest.TestCase):
    def test_the_matrix_measures_lora_under_both_versions(self):
        entries, _ = matrices.load_matrix()
        lora = [(case, p) for case, _, p in entries if p.lora]
        self.assertIn(2, {p.fsdp_version for _, p in lora})
        self.assertEqual({p.use_orig_params for _, p in lora if p.fsdp_version == 1}, {True, False})
        self.assertIn("l1b-fsdp2-lora-r16-qkv-tt", {case["name"] for case, _ in lora})
        smoke, _ = matrices.load_matrix(os.path.join(torch_memory_test_util.SCRIPTS, "torch_memory", "smoke_matrix.json"))
        self.assertEqual({(p.fsdp_version, p.use_orig_params) for _, _, p in smoke if p.lora}, {(1, False), (1, True), (2, True)})

    def test_a_case_the_harness_cannot_build_is_refused_by_name(self):
        case = {"name": "a", "model": "llama-1b", "world": 8, "why": "test",
                "plan": {"fsdp_version": 1, "use_orig_params": False, "lora": {"rank": 8, "targets": ["head"]}}}
        with self.assertRaises(InputError) as cm:
            matrices.check_case(case, 0)
        self.assertEqual(cm.exception.field, "matrix.cases[0] (a): plan.lora.targets")


if __name__ == "__main__":
    unittest.main()
