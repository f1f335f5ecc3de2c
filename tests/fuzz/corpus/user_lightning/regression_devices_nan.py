from lightning.pytorch.strategies import FSDPStrategy
strategy = FSDPStrategy(sharding_strategy="FULL_SHARD")
trainer = L.Trainer(devices=nan, num_nodes=1, strategy=strategy)
