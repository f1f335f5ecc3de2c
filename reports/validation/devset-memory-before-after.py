# Compares the pre-change fsdpsim binary (/tmp/fsdpsim-ref, not in the tree) with build/fsdpsim on the 8 simulable
# memory records of published-dev-set-2 (plans as tests/calibrate/devset_memory.cpp maps them). Run from anywhere.
import json,subprocess
L=lambda mb:{"fsdp_version":1,"sharding_strategy":"FULL_SHARD","activation_checkpointing":"full","implementation":"litgpt","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","optimizer":"adamw","micro_batch":mb,"seq_len":1304}
rows=[("gt0448","llama3-70b","8xA100-80GB",{"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":"full","compile":True,"implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","cpu_offload":True,"optimizer_impl":"fused"},14.93),
("gt0449","llama3-70b","8xA100-80GB",{"fsdp_version":2,"micro_batch":2,"seq_len":2048,"activation_checkpointing":"full","compile":True,"implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","trainable_fraction":0.0012},29.64),
("gt0453","llama2-70b","8xA100-80GB",{"fsdp_version":1,"sharding_strategy":"FULL_SHARD","micro_batch":4,"seq_len":4096,"activation_checkpointing":"full","implementation":"hf","param_dtype":"bf16","reduce_dtype":"bf16","master_weights_dtype":"bf16","trainable_fraction":0.0012},26.40),
("gt0513","llama2-7b","2xA100-40GB",dict(L(1),trainable_fraction=4194304/6738415616),22.18),
("gt0514","llama2-7b","2xA100-40GB",dict(L(2),trainable_fraction=4194304/6738415616),22.47),
("gt0515","llama2-7b","2xA100-40GB",dict(L(4),trainable_fraction=4194304/6738415616),23.39),
("gt0516","llama2-13b","2xA100-40GB",dict(L(1),trainable_fraction=6553600/13015864320),None),
("gt0517","llama2-13b","4xA100-40GB",dict(L(1),trainable_fraction=6553600/13015864320),35.57)]
for rid,m,c,p,meas in rows:
  for b in ("/tmp/fsdpsim-ref","/work/main/build/fsdpsim"):
    r=subprocess.run([b,"simulate","--model",m,"--cluster",c,"--plan",json.dumps(p),"--json","/tmp/o.json"],capture_output=True,text=True)
    if r.returncode: print(rid,b[-12:],"ERR",r.stderr.strip()[:150]); continue
    d=json.load(open("/tmp/o.json")); d=d.get("result",d)
    a=max(d["peak_memory_bytes"]["allocated"], d.get("first_step_peak_memory_bytes",{}).get("allocated",0))/1e9
    print(rid,b[-12:],"pred %.2f GB"%a, "meas",meas, "err %+.1f%%"%((a-meas)/meas*100) if meas else "", "fits",d["fits"])
