"""Plan checking of the torch-memory harness (scripts/torch_memory/plan.py), without PyTorch."""
import re
import unittest

import torch_memory_test_util as util
from torch_memory import plan as plans
from torch_memory.common import InputError


def resolve(plan, world=8, units=None):
    return plans.resolve_plan(plan, world, 8, units)


class FieldAssertions(unittest.TestCase):
    def assertField(self, plan, field, world=8, units=None):
        """The plan is refused with an InputError naming `field`."""
        with self.assertRaises(InputError) as cm:
            resolve(plan, world, units)
        self.assertEqual(cm.exception.field, field, str(cm.exception))


class PlanKeys(FieldAssertions):
    def test_readme_keys_are_the_harness_keys(self):
        # README.md "Plan keys" is the contract; the harness must know exactly those keys.
        with open(f"{util.SOURCE_DIR}/README.md", encoding="utf-8") as f:
            text = f.read()
        table = text[text.index("## Plan keys"):text.index("Mesh defaults")]
        keys = [m.group(1) for m in re.finditer(r"^\| ([a-z_0-9]+)\s+\|", table, re.M) if m.group(1) != "key"]
        self.assertEqual(tuple(keys), plans.README_KEYS)

    def test_issue19_keys_are_accepted(self):
        p = plans.parse_plan({"implementation": "litgpt", "compile": True, "float8": "rowwise",
                              "alloc_conf": "expandable_segments:True,max_split_size_mb:512",
                              "free_logits_before_backward": True, "optimizer_impl": "fused",
                              "module_overrides": {"last_block": {"reshard_after_forward": False}}})
        self.assertEqual((p.implementation, p.compile, p.float8, p.optimizer_impl), ("litgpt", True, "rowwise", "fused"))
        self.assertEqual(p.module_overrides, {"last_block": False})

    def test_lora_is_read_as_the_simulator_reads_it(self):
        p = plans.parse_plan({"lora": {"rank": 8, "targets": ["v", "q", "mlp"], "dropout": 0.05}})
        self.assertEqual(p.lora, {"rank": 8, "targets": ["q", "v", "gate", "up", "down"], "dropout": 0.05,
                                  "quantize_base": "none"})
        self.assertField({"lora": {"rank": 0, "targets": ["q"]}}, "plan.lora.rank")
        self.assertField({"lora": {"rank": 8, "targets": ["qq"]}}, "plan.lora.targets")
        self.assertField({"lora": {"rank": 8, "targets": ["q"], "dropout": 1}}, "plan.lora.dropout")
        self.assertField({"lora": {"rank": 8, "targets": ["q"], "quantize_base": "int4"}}, "plan.lora.quantize_base")
        qlora = plans.parse_plan({"lora": {"rank": 8, "targets": ["q"], "quantize_base": "nf4"}})
        self.assertEqual(qlora.lora["quantize_base"], "nf4")    # built with torchao's NF4Tensor (train.py)
        for optimizer in plans.BNB_OPTIMIZERS:     # the simulator's, not built here (no bitsandbytes)
            self.assertField({"optimizer": optimizer}, "plan.optimizer")
        for optimizer in plans.TORCHAO_OPTIMIZERS:
            self.assertEqual(plans.parse_plan({"optimizer": optimizer}).optimizer, optimizer)
        self.assertEqual(set(plans.LOW_BIT_OPTIMIZERS), set(plans.BNB_OPTIMIZERS) | set(plans.TORCHAO_OPTIMIZERS))
        self.assertField({"lora": {"rank": 8, "targets": ["q"]}, "trainable_fraction": 0.1}, "plan.trainable_fraction")
        self.assertEqual(resolve({"lora": {"rank": 8, "targets": ["q"]}, "frozen_units": ["root"]}, 8, None).lora["rank"], 8)

    def test_bad_values_name_the_field(self):
        self.assertField({"nonsense": 1}, "plan.nonsense")
        self.assertField({"implementation": "xla"}, "plan.implementation")
        self.assertField({"compile": "yes"}, "plan.compile")
        self.assertField({"float8": "e4m3"}, "plan.float8")
        self.assertField({"optimizer_impl": "apex"}, "plan.optimizer_impl")
        self.assertField({"free_logits_before_backward": 1}, "plan.free_logits_before_backward")
        self.assertField({"micro_batch": 0}, "plan.micro_batch")
        self.assertField({"seq_len": 2.5}, "plan.seq_len")
        self.assertField({"activation_checkpointing": "every_0"}, "plan.activation_checkpointing")
        self.assertField({"activation_checkpointing": {"mode": "full", "every_k": 2}}, "plan.activation_checkpointing.every_k")
        self.assertField({"cpu_offload": {"params": True, "optimizer": False}}, "plan.cpu_offload.optimizer")
        self.assertField({"trainable_fraction": 0}, "plan.trainable_fraction")
        self.assertField({"mesh": [2, 2, 2]}, "plan.mesh")
        self.assertField({"cross_entropy_chunks": 8}, "plan.cross_entropy_chunks")   # only with "chunked"
        self.assertField({"cross_entropy": "chunked", "cross_entropy_chunks": 0}, "plan.cross_entropy_chunks")
        self.assertField({"loss_in_model_forward": "no"}, "plan.loss_in_model_forward")
        self.assertField({"cross_entropy": "chunked", "loss_in_model_forward": True}, "plan.loss_in_model_forward")

    def test_loss_in_model_forward_is_unset_unless_given(self):
        self.assertIsNone(plans.parse_plan({}).loss_in_model_forward)
        self.assertFalse(plans.parse_plan({"loss_in_model_forward": False}).loss_in_model_forward)

    def test_checkpoint_around_compile_parses(self):
        ac = plans.parse_plan({"compile": True, "activation_checkpointing": {"mode": "every_k", "every_k": 2,
                                                                           "outside_compile": True}}).checkpointing
        self.assertEqual((ac.mode, ac.every_k, ac.outside_fsdp, ac.outside_compile), ("every_k", 2, False, True))
        self.assertFalse(plans.parse_plan({"activation_checkpointing": "full"}).checkpointing.outside_compile)

    def test_chunked_loss_parses(self):
        p = plans.parse_plan({"cross_entropy": "chunked", "cross_entropy_chunks": 4})
        self.assertEqual((p.cross_entropy, p.cross_entropy_chunks), ("chunked", 4))
        self.assertEqual(plans.parse_plan({"cross_entropy": "chunked"}).cross_entropy_chunks, 8)

    def test_alloc_conf(self):
        self.assertEqual(plans.parse_alloc_conf("expandable_segments:True, max_split_size_mb:512"),
                         {"expandable_segments": "True", "max_split_size_mb": "512"})
        self.assertEqual(plans.parse_alloc_conf(""), {})
        for bad in ("expandable_segments:yes", "max_split_size_mb:20", "no_such_option:1", "expandable_segments",
                    "expandable_segments:True,expandable_segments:False"):
            with self.assertRaises(InputError, msg=bad) as cm:
                plans.parse_plan({"alloc_conf": bad})
            self.assertEqual(cm.exception.field, "plan.alloc_conf")

    def test_module_overrides(self):
        units = [{"name": "root"}, {"name": "model.layers.0"}, {"name": "model.layers.1"}]
        p = resolve({"module_overrides": {"model.layers.1": {"reshard_after_forward": 4}}}, units=units)
        self.assertEqual(p.module_overrides, {"model.layers.1": 4})
        self.assertField({"module_overrides": {"model.layers.7": {"reshard_after_forward": False}}},
                         "plan.module_overrides.model.layers.7", units=units)
        self.assertField({"module_overrides": {"root": {"reshard_after_forward": 3}}},
                         "plan.module_overrides.root.reshard_after_forward", units=units)
        self.assertField({"fsdp_version": 1, "module_overrides": {"root": {"reshard_after_forward": False}}},
                         "plan.module_overrides")
        self.assertField({"module_overrides": {"root": {"reshard": False}}}, "plan.module_overrides.root")

    def test_frozen_units(self):
        units = [{"name": "root"}, {"name": "model.layers.0"}, {"name": "model.layers.1"}]
        p = resolve({"trainable_fraction": 0.1, "frozen_units": ["root", "model.layers.0", "last_block"]}, units=units)
        self.assertEqual(p.frozen_units, ["root", "model.layers.0", "last_block"])
        self.assertField({"trainable_fraction": 0.1, "frozen_units": "root"}, "plan.frozen_units")
        self.assertField({"trainable_fraction": 0.1, "frozen_units": ["root", 3]}, "plan.frozen_units")
        self.assertField({"trainable_fraction": 0.1, "frozen_units": ["model.layers.9"]}, "plan.frozen_units", units=units)
        self.assertField({"frozen_units": ["root"]}, "plan.frozen_units")   # (trainable_fraction 1: nothing to freeze)


class Resolve(FieldAssertions):
    """Mesh defaults and strategies as program/plan.cpp resolve_plan / effective_strategy derive them."""

    def test_mesh_defaults(self):
        self.assertEqual((resolve({}).mesh_replicate, resolve({}).mesh_shard), (1, 8))
        p = resolve({"fsdp_version": 1, "sharding_strategy": "NO_SHARD"})
        self.assertEqual((p.mesh_replicate, p.mesh_shard), (8, 1))
        p = resolve({"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD"}, world=64)
        self.assertEqual((p.mesh_replicate, p.mesh_shard), (8, 8))
        p = resolve({"mesh": {"replicate": 4, "shard": 16}}, world=64)
        self.assertEqual((p.mesh_replicate, p.mesh_shard, p.sharding_strategy), (4, 16, "HYBRID_SHARD"))

    def test_fsdp2_strategy_from_raf_and_mesh(self):
        self.assertEqual(resolve({"sharding_strategy": "SHARD_GRAD_OP"}).reshard_after_forward, False)
        self.assertEqual(resolve({"reshard_after_forward": False}).sharding_strategy, "SHARD_GRAD_OP")
        self.assertEqual(resolve({"sharding_strategy": "NO_SHARD"}).sharding_strategy, "NO_SHARD")
        self.assertEqual(resolve({"sharding_strategy": "_HYBRID_SHARD_ZERO2"}, world=64).sharding_strategy, "_HYBRID_SHARD_ZERO2")
        self.assertEqual(resolve({"reshard_after_forward": 4}).reshard_after_forward, 4)

    def test_consistency_rules(self):
        t = self
        t.assertField({"sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": True}, "plan.sharding_strategy")
        t.assertField({"fsdp_version": 1, "reshard_after_forward": False}, "plan.reshard_after_forward")
        t.assertField({"reshard_after_forward": 3}, "plan.reshard_after_forward")
        t.assertField({"reshard_after_forward": 8}, "plan.reshard_after_forward")
        t.assertField({"mesh": [2, 2]}, "plan.mesh")
        t.assertField({"fsdp_version": 1, "sharding_strategy": "FULL_SHARD", "mesh": [2, 4]}, "plan.mesh")
        t.assertField({"backward_prefetch": "BACKWARD_POST"}, "plan.backward_prefetch")
        t.assertField({"use_orig_params": False}, "plan.use_orig_params")
        t.assertField({"fsdp_version": 1, "prefetch_depth": 2}, "plan.prefetch_depth")
        t.assertField({"master_weights_dtype": "bf16", "param_dtype": "fp32"}, "plan.master_weights_dtype")
        t.assertField({"activation_checkpointing": {"mode": "selective_op", "outside_fsdp": True}},
                      "plan.activation_checkpointing.outside_fsdp")
        t.assertField({"activation_checkpointing": {"mode": "full", "outside_compile": True}},
                      "plan.activation_checkpointing.outside_compile")
        t.assertField({"compile": True, "activation_checkpointing": {"mode": "selective_op", "outside_compile": True}},
                      "plan.activation_checkpointing.outside_compile")
        t.assertField({"compile": True, "activation_checkpointing": {"mode": "full", "outside_compile": "yes"}},
                      "plan.activation_checkpointing.outside_compile")
        t.assertField({"fsdp_version": 1, "cpu_offload": True, "grad_accum": 2, "grad_sync": True}, "plan.cpu_offload")
        t.assertField({"micro_batch": 65536, "seq_len": 65536}, "plan.micro_batch")

    def test_explicit_plan_names_every_issue19_key(self):
        out = plans.explicit_plan({"micro_batch": 2})
        for key in plans.NEW_KEYS:
            self.assertIn(key, out)
        self.assertEqual(out["micro_batch"], 2)
        self.assertEqual(plans.explicit_plan({"implementation": "hf"})["implementation"], "hf")


if __name__ == "__main__":
    unittest.main()
