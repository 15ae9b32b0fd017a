"""Data x tensor x pipeline parallelism for jaxhc's GPT, every byte through jaxhc's collectives.

One module per concern: `tensor` (Megatron's conjugate operators), `pipeline` (the GPipe
schedule), `layout` (where each parameter lives on the mesh), `zero` (the ZeRO-1 AdamW update) and
`step` (the jitted train step, eval loss and logits). The public API is re-exported by
`jaxhc.model`.
"""
