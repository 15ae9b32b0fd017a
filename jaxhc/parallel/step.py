"""The train step, eval loss and logits of the GPT on a ("data", "tensor", "pipe") mesh.

Each function runs per shard inside one `jax.shard_map` (``check_vma=False``: the Megatron
operators of `jaxhc.parallel.tensor` make every reduction explicit) and moves every cross-device
byte through jaxhc's collectives under the policy:

* "tensor": `jaxhc.psum` of block outputs and of their input gradients (``kind="act"``);
* "pipe": `jaxhc.ppermute` of activations and their gradients (``kind="act"``) and `jaxhc.psum` of
  the gradients of ``wte``, ``wpe`` and ``ln_f`` (``kind="grad"``), which every stage holds;
* "data": `jaxhc.psum_scatter` of gradients (``kind="grad"``), `jaxhc.all_gather` of updated
  parameters (``kind="param"``);
* two plain scalar sums, also through jaxhc so the ledger counts them (kind "other"): the loss over
  ("data", "pipe") and the squared gradient norm over all axes.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc.model import gpt
from jaxhc.model.config import AXES, GPTConfig, MeshConfig, OptimConfig, validate
from jaxhc.parallel import zero
from jaxhc.parallel.layout import FlatLayout, param_specs
from jaxhc.parallel.pipeline import gpipe
from jaxhc.parallel.tensor import TensorParallel
from jaxhc.policy import Policy

OPT_SPEC = P("pipe", "tensor", "data")  # AdamW moments: (pipe, tensor, padded flat params)


@flax.struct.dataclass
class TrainState:
    """Everything a step updates, as sharded `jax.Array`s on the mesh.

    step:      int32 scalar, replicated: the number of updates applied so far.
    params:    the single-layout parameter tree (see `jaxhc.model.gpt`), sharded as in
               `jaxhc.parallel.layout`.
    opt_state: optax AdamW state; its moments have shape (pipe, tensor, padded local parameter
               count) and are split over "data" (ZeRO-1); its count is a replicated scalar.
    """

    step: jax.Array
    params: dict
    opt_state: Any


# One compiled initializer per model config, run on the default device: every mesh gets the very
# same values, then they are split over the mesh.
_init_params = jax.jit(gpt.init_params, static_argnums=0)


def make_mesh(mesh_cfg: MeshConfig, devices=None) -> Mesh:
    """A mesh with axes ("data", "tensor", "pipe") over `devices` (default: all of jax's)."""
    devices = list(jax.devices() if devices is None else devices)
    validate(None, mesh_cfg, n_devices=len(devices))
    return Mesh(np.array(devices).reshape(mesh_cfg.shape), AXES)


class _Plan:
    """Shapes, shardings and the flat ZeRO layout of one (model, mesh) pair."""

    def __init__(self, model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, optim_cfg=None):
        validate(model_cfg, mesh_cfg, n_devices=mesh.devices.size)
        if tuple(mesh.axis_names) != AXES or tuple(mesh.devices.shape) != mesh_cfg.shape:
            raise ValueError(
                f"mesh axes {dict(mesh.shape)} do not match mesh config "
                f"data={mesh_cfg.data}, tensor={mesh_cfg.tensor}, pipe={mesh_cfg.pipe}"
            )
        self.model, self.mesh_cfg, self.mesh, self.optim = model_cfg, mesh_cfg, mesh, optim_cfg
        self.param_shapes = jax.eval_shape(functools.partial(gpt.init_params, model_cfg), 0)
        self.param_specs = param_specs(self.param_shapes)
        self.layout = FlatLayout(self.param_shapes, mesh_cfg)
        if optim_cfg is not None:
            chunk = jax.ShapeDtypeStruct((self.layout.chunk,), jnp.float32)
            self.opt_local = jax.eval_shape(functools.partial(zero.init_chunk, optim_cfg), chunk)
            self.opt_specs = jax.tree.map(lambda x: OPT_SPEC if x.ndim else P(), self.opt_local)
            self.state_specs = TrainState(P(), self.param_specs, self.opt_specs)

    def shardings(self, specs):
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs)

    def check_tokens(self, shape, width: int) -> None:
        if len(shape) != 2 or shape[1] != width:
            raise ValueError(f"tokens have shape {tuple(shape)}; expected (batch, {width})")
        validate(self.model, self.mesh_cfg, batch_size=shape[0])

    def shard_map(self, fn, in_specs, out_specs):
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )


def _policy(policy) -> Policy | None:
    return None if policy is None else Policy.load(policy)


def _local_opt(opt_state):
    return jax.tree.map(lambda x: x.reshape(-1) if x.ndim else x, opt_state)


def _global_opt(opt_state):
    return jax.tree.map(lambda x: x.reshape(1, 1, -1) if x.ndim else x, opt_state)


# ---------------------------------------------------------------------------------------------
# Per-shard model: embedding on the first stage, blocks through the pipeline, head on the last.


def _forward(params, inputs, cfg: GPTConfig, mesh_cfg: MeshConfig, policy, last_stage_fn):
    """Run the pipelined model on this rank's `inputs` (B_local, T) and return
    ``last_stage_fn(hidden)`` on the last stage, zeros elsewhere; hidden is (M, B_local / M, T, C).
    """
    tp = TensorParallel(mesh_cfg.tensor, policy)
    stage, stages = jaxhc.axis_index("pipe"), jaxhc.axis_size("pipe")
    micro = inputs.reshape(mesh_cfg.microbatches, -1, inputs.shape[-1])
    x = lax.cond(
        stage == 0,
        lambda: gpt.embed(params, micro, cfg),
        lambda: jnp.zeros((*micro.shape, cfg.n_embd), cfg.compute_dtype),
    )
    hidden = gpipe(lambda h: gpt.run_blocks(params["blocks"], h, cfg, tp), x, policy)
    out = jax.eval_shape(last_stage_fn, hidden)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out)
    return lax.cond(stage == stages - 1, last_stage_fn, lambda _: zeros, hidden)


def _local_loss(params, tokens, cfg, mesh_cfg, policy):
    """This rank's share of the global mean loss: the sum of its token losses over all tokens."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    total = tokens.shape[0] * jaxhc.axis_size("data") * targets.shape[1]

    def loss_sum(hidden):
        logits = gpt.head(params, hidden, cfg)
        return gpt.token_losses(logits, targets.reshape(hidden.shape[:-1])).sum() / total

    return _forward(params, inputs, cfg, mesh_cfg, policy, loss_sum)


def _loss_and_grads(params, tokens, cfg, mesh_cfg, policy):
    """Global loss (every rank) and this rank's gradients, not yet summed over "data"."""
    objective = functools.partial(_local_loss, cfg=cfg, mesh_cfg=mesh_cfg, policy=policy)
    local, grads = jax.value_and_grad(objective)(params, tokens)
    if jaxhc.axis_size("pipe") > 1:  # every stage holds wte, wpe, ln_f: sum their gradients
        shared = {k: grads[k] for k in ("wte", "wpe", "ln_f")}
        grads = {**grads, **jaxhc.psum(shared, "pipe", policy=policy, kind="grad")}
    return zero.psum_scalar(local, ("data", "pipe")), grads


# ---------------------------------------------------------------------------------------------
# Public API.


def init_state(
    model_cfg: GPTConfig,
    mesh_cfg: MeshConfig,
    optim_cfg: OptimConfig,
    mesh: Mesh,
    seed: int,
    params=None,
) -> TrainState:
    """A fresh TrainState placed on `mesh`: parameters from `seed` (or the given single-layout
    `params`, e.g. from `from_hf_gpt2`), zero AdamW moments, step 0.

    The parameters depend on the seed only, not on the mesh: the same seed gives the same model on
    every mesh, so runs on different meshes are comparable.
    """
    plan = _Plan(model_cfg, mesh_cfg, mesh, optim_cfg)
    params = from_single(_init_params(model_cfg, seed) if params is None else params, mesh)

    def zeros(s):
        shape = (mesh_cfg.pipe, mesh_cfg.tensor, plan.layout.padded) if s.ndim else ()
        return jnp.zeros(shape, s.dtype)

    opt_state = jax.jit(
        lambda: jax.tree.map(zeros, plan.opt_local), out_shardings=plan.shardings(plan.opt_specs)
    )()
    step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, P()))
    return TrainState(step, params, opt_state)


def make_train_step(
    model_cfg: GPTConfig, mesh_cfg: MeshConfig, optim_cfg: OptimConfig, mesh: Mesh, policy
):
    """``step(state, tokens) -> (state, metrics)``, jitted; `state` is donated.

    tokens: int32 [global_batch, block_size + 1] (inputs ``tokens[:, :-1]``, targets
    ``tokens[:, 1:]``); global_batch must be divisible by mesh data x microbatches. A host array is
    placed split over "data".
    metrics: float32 scalars ``loss`` (mean next-token cross-entropy of the batch, before the
    update), ``grad_norm`` (before clipping) and ``lr`` (the rate this step applied).
    policy: a `jaxhc.Policy`, a preset name or YAML path, or None for plain `jax.lax` collectives.
    Traffic is recorded by jaxhc's collectives in any active `jaxhc.accounting.Ledger`.

    On XLA:CPU with many host devices, bound the steps in flight (e.g. block on every step's
    metrics): dozens of queued executions with collectives trip XLA's rendezvous timeout.
    """
    plan = _Plan(model_cfg, mesh_cfg, mesh, optim_cfg)
    policy = _policy(policy)

    def per_shard(state: TrainState, tokens):
        loss, grads = _loss_and_grads(state.params, tokens, model_cfg, mesh_cfg, policy)
        params, opt_state, grad_norm, lr = zero.update(
            state.params,
            _local_opt(state.opt_state),
            grads,
            state.step,
            plan.layout,
            optim_cfg,
            policy,
        )
        new = TrainState(state.step + 1, params, _global_opt(opt_state))
        return new, {"loss": loss, "grad_norm": grad_norm, "lr": lr}

    metric_specs = {"loss": P(), "grad_norm": P(), "lr": P()}
    sharded = plan.shard_map(
        per_shard, (plan.state_specs, P("data")), (plan.state_specs, metric_specs)
    )
    state_shardings = plan.shardings(plan.state_specs)

    @functools.partial(
        jax.jit,
        in_shardings=(state_shardings, NamedSharding(mesh, P("data"))),
        out_shardings=(state_shardings, plan.shardings(metric_specs)),
        donate_argnums=0,
    )
    def step(state, tokens):
        plan.check_tokens(tokens.shape, model_cfg.block_size + 1)
        return sharded(state, tokens.astype(jnp.int32))

    return step


def make_eval_loss(model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, policy):
    """``eval_loss(params, tokens) -> loss``, jitted: the train step's loss without an update.

    params: ``state.params``; tokens as for the train step.
    """
    plan = _Plan(model_cfg, mesh_cfg, mesh)
    policy = _policy(policy)

    def per_shard(params, tokens):
        local = _local_loss(params, tokens, model_cfg, mesh_cfg, policy)
        return zero.psum_scalar(local, ("data", "pipe"))

    sharded = plan.shard_map(per_shard, (plan.param_specs, P("data")), P())

    @functools.partial(
        jax.jit, in_shardings=(plan.shardings(plan.param_specs), NamedSharding(mesh, P("data")))
    )
    def eval_loss(params, tokens):
        plan.check_tokens(tokens.shape, model_cfg.block_size + 1)
        return sharded(params, tokens.astype(jnp.int32))

    return eval_loss


def make_loss_and_grads(model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, policy):
    """``loss_and_grads(params, tokens) -> (loss, grads)``, jitted: the gradients the train step
    feeds AdamW (before clipping), in the single layout and sharded like the parameters.

    For tests and inspection: the reduced chunks are gathered back over "data" with
    `jaxhc.all_gather` (``kind="grad"``), which the train step does not do.
    """
    plan = _Plan(model_cfg, mesh_cfg, mesh)
    policy = _policy(policy)

    def per_shard(params, tokens):
        loss, grads = _loss_and_grads(params, tokens, model_cfg, mesh_cfg, policy)
        chunk = zero.reduce_gradients(grads, plan.layout, policy)
        if mesh_cfg.data > 1:
            chunk = jaxhc.all_gather(chunk, "data", tiled=True, policy=policy, kind="grad")
        return loss, plan.layout.unflatten(chunk)

    specs = (P(), plan.param_specs)
    sharded = plan.shard_map(per_shard, (plan.param_specs, P("data")), specs)
    shardings = plan.shardings(plan.param_specs)

    @functools.partial(
        jax.jit,
        in_shardings=(shardings, NamedSharding(mesh, P("data"))),
        out_shardings=plan.shardings(specs),
    )
    def loss_and_grads(params, tokens):
        plan.check_tokens(tokens.shape, model_cfg.block_size + 1)
        return sharded(params, tokens.astype(jnp.int32))

    return loss_and_grads


def make_logits(model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, policy):
    """``logits(params, inputs) -> float32 [batch, T, vocab]`` for int inputs [batch, T], jitted.

    For tests and inspection: the last stage's logits are picked outside the per-shard program,
    which moves them between devices with XLA's own transfers.
    """
    plan = _Plan(model_cfg, mesh_cfg, mesh)
    policy = _policy(policy)

    def per_shard(params, inputs):
        def last_stage(hidden):
            return gpt.head(params, hidden, model_cfg).reshape(*inputs.shape, -1)

        return _forward(params, inputs, model_cfg, mesh_cfg, policy, last_stage)[None]

    sharded = plan.shard_map(per_shard, (plan.param_specs, P("data")), P("pipe", "data"))

    @functools.partial(
        jax.jit, in_shardings=(plan.shardings(plan.param_specs), NamedSharding(mesh, P("data")))
    )
    def logits(params, inputs):
        if inputs.ndim != 2 or inputs.shape[1] > model_cfg.block_size:
            raise ValueError(f"inputs have shape {inputs.shape}; expected (batch, <= block_size)")
        validate(model_cfg, mesh_cfg, batch_size=inputs.shape[0])
        return sharded(params, inputs.astype(jnp.int32))[-1]

    return logits


def from_single(params, mesh: Mesh) -> dict:
    """Place a single-layout parameter tree (host or device arrays) on `mesh`, sharded."""
    specs = param_specs(params)
    return jax.tree.map(
        lambda x, s: jax.device_put(jnp.asarray(x, jnp.float32), NamedSharding(mesh, s)),
        params,
        specs,
    )


def params_to_single(state_or_params) -> dict:
    """The parameters of a TrainState (or a sharded parameter tree) as host numpy arrays."""
    params = state_or_params.params if isinstance(state_or_params, TrainState) else state_or_params
    return jax.device_get(params)
