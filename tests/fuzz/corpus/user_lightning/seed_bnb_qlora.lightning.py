import torch
from lightning.pytorch.strategies import FSDPStrategy
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model

bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
model = get_peft_model(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb),
                       LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]))
strategy = FSDPStrategy(auto_wrap_policy={LlamaDecoderLayer}, use_orig_params=True)
trainer = L.Trainer(strategy=strategy, precision="bf16-true")
