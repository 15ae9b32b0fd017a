"""Data x tensor x pipeline parallelism for jaxhc's GPT, every byte through jaxhc's collectives.

One module per concern: `tensor` (Megatron's conjugate operators), `pipeline` (the GPipe
schedule), `layout` (where each parameter lives on the mesh, the flat ZeRO vector), `zero` (the
ZeRO-1 AdamW update), `state` (the train state and its placement) and `step` (the per-shard
programs and their jitted `shard_map`s). The public API is re-exported by `jaxhc.model`.
"""
