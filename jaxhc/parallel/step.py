"""The train step, eval loss and logits of the GPT on a ("data", "tensor", "pipe") mesh.

Each program is written per shard (`per_shard_train_step`, `per_shard_eval_loss`: what a rank
runs on its blocks) and mapped over the mesh by one `jax.shard_map` (``check_vma=False``: the
Megatron operators of `jaxhc.model.tensor_parallel` make every reduction explicit) in the `make_*`
functions, under the policy its builder is given (loaded once; the per-shard function traces
inside ``jaxhc.context.use(policy=...)``, so the model and ZeRO code below name no policy). Every
cross-device byte goes through jaxhc's collectives under that policy:

* "tensor": `jaxhc.psum` of block outputs and of their input gradients (``kind="act"``);
* "pipe": `jaxhc.ppermute` of activations and their gradients (``kind="act"``) and
  `jaxhc.psum_pair` of the gradients of ``ln_f`` and the head (``wte`` or ``lm_head``) between
  the first and the last stage (``kind="grad"``; see `jaxhc.parallel.grads.sum_shared`);
* "data": `jaxhc.psum_scatter` of gradients (``kind="grad"``), `jaxhc.all_gather` of updated
  parameters (``kind="param"``); under a sharding plan that nests the data axis
  (`jaxhc.parallel.amsp`), level by level over its sub-axes, and the reduced gradient chunks
  all-gathered (``kind="grad"``) over the sub-axes outside the plan's gradient group;
* two plain scalar sums, also through jaxhc so the ledger counts them (kind "other"): the loss over
  ("data", "pipe") and the squared gradient norm over all axes.

With ``fidelity_every`` > 0 a sampled step reduces the gradients a second time, exactly, outside
the ledger (`jaxhc.parallel.fidelity`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import context
from jaxhc._compat import axis_tuple
from jaxhc.model import gpt
from jaxhc.model.config import GPTConfig, MeshConfig, OptimConfig, validate
from jaxhc.parallel import fidelity, keep, zero
from jaxhc.parallel import grads as shard_grads
from jaxhc.parallel.state import Plan, TrainState, check_mesh, shardings
from jaxhc.policy import Policy

METRIC_SPECS = {k: P() for k in ("loss", "grad_norm", "lr", "skipped", *fidelity.METRICS)}


def _under(policy: Policy | None, fn):
    """`fn` traced under `policy` in `jaxhc.context`, whatever the caller's context: the program
    then matches the state its builder sized with the same policy (error-feedback residuals)."""

    @functools.wraps(fn)
    def traced(*args):
        with context.use(policy=policy):
            return fn(*args)

    return traced


def _local_opt(opt_state):
    return jax.tree.map(lambda x: x.reshape(-1) if x.ndim else x, opt_state)


def _global_opt(opt_state):
    return jax.tree.map(lambda x: x.reshape(1, 1, -1) if x.ndim else x, opt_state)


def _map(fn, mesh: Mesh, in_specs, out_specs):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# ---------------------------------------------------------------------------------------------
# Per-shard programs.


def per_shard_train_step(
    model_cfg: GPTConfig,
    mesh_cfg: MeshConfig,
    optim_cfg: OptimConfig,
    policy,
    fidelity_every: int = 0,
    overlap: bool = True,
):
    """``step(state, tokens) -> (state, metrics)`` as one rank runs it, on its blocks.

    `state` has the blocks of `train_state_specs`, `tokens` this rank's rows (split over "data").
    For a launcher that runs per-shard functions itself (one process per device); the batch is
    not validated here (`validate(..., batch_size=)` it first). `fidelity_every`, `overlap`: see
    `make_train_step`.
    """
    policy = context.as_policy(policy)
    plan = Plan(model_cfg, mesh_cfg, optim_cfg, policy)
    shard, layout = plan.shard, plan.layout

    def exact_chunk(local_grads):
        with context.use(policy=None):
            exact = zero.reduce_gradients(shard_grads.sum_shared(local_grads), layout, shard=shard)
        return zero.finest(exact, layout, shard)[0]

    if shard.sharded_params and fidelity_every > 0:
        raise ValueError(
            f"train.fidelity_every={fidelity_every}: the sampled fidelity needs every rank's "
            f"local gradients, which sharded parameters (mesh.shard.params={shard.params}) "
            "never hold; use 0"
        )

    def step(state: TrainState, tokens):
        params = state.params
        before = _local_opt(state.opt_state)
        if shard.sharded_params:
            params = params.reshape(-1)  # this rank's flat parameter chunk
            # keep: step 0 gathers the exact parameters, as ZeRO-1's first forward runs on them
            choose = keep.first_gathers(state.step, shard) if shard.gather == "keep" else None
            loss, g, opt_state = shard_grads.sharded_loss_and_grads(
                params, before, tokens, model_cfg, mesh_cfg, plan, overlap, choose
            )
            local = None
        elif overlap and shard_grads.overlaps(
            plan, fidelity_every, codecs := zero.whole_codecs(layout, shard)
        ):
            residual = before.get("residual")
            got = shard_grads.overlapped_loss_and_grads(
                params, tokens, model_cfg, mesh_cfg, plan, codecs, residual
            )
            loss, g = got[:2]
            opt_state = before if residual is None else {**before, "residual": got[2]}
            local = None
        else:
            loss, local = shard_grads.local_loss_and_grads(
                params, tokens, model_cfg, mesh_cfg, shard.data_axis
            )
            g, opt_state = zero.reduce(
                shard_grads.sum_shared(local, shard.axes), before, layout, shard
            )
        chunk, start = zero.finest(g, layout, shard)
        observed = fidelity.sample(
            state.step, fidelity_every, chunk, start, local, exact_chunk, layout, shard
        )
        previous = state.params if plan.param_delta else None
        params, opt_state, grad_norm, lr = zero.update(
            opt_state, g, state.step, layout, optim_cfg, shard, before, previous
        )
        if shard.sharded_params:
            params = params.reshape(1, 1, -1)
        new = TrainState(state.step + 1, params, _global_opt(opt_state))
        skipped = jnp.logical_not(jnp.isfinite(grad_norm))  # zero.update left the state as it was
        return new, {"loss": loss, "grad_norm": grad_norm, "lr": lr, "skipped": skipped, **observed}

    return _under(policy, step)


def per_shard_eval_loss(model_cfg: GPTConfig, mesh_cfg: MeshConfig, policy, data="data"):
    """``eval_loss(params, tokens) -> loss`` as one rank runs it (see `per_shard_train_step`);
    `data`: the data axis (the sub-axes of `jaxhc.parallel.amsp` on its view of the mesh)."""
    plan = Plan(model_cfg, mesh_cfg, policy=policy)  # the train state's flat layout

    def eval_loss(params, tokens):
        if plan.sharded_params:  # this rank's chunk, gathered over the parameter group
            params = plan.layout.unflatten(zero.gather_chunk(params[0, 0], plan.shard))
        local = shard_grads.local_loss(params, tokens, model_cfg, mesh_cfg, data)
        return zero.psum_scalar(local, (*axis_tuple(data), "pipe"))

    return _under(context.as_policy(policy), eval_loss)


# ---------------------------------------------------------------------------------------------
# Jitted programs on a jax.sharding.Mesh.


def make_train_step(
    model_cfg: GPTConfig,
    mesh_cfg: MeshConfig,
    optim_cfg: OptimConfig,
    mesh: Mesh,
    policy,
    fidelity_every: int = 0,
    overlap: bool = True,
):
    """``step(state, tokens) -> (state, metrics)``, jitted; `state` is donated.

    tokens: int32 [global_batch, block_size + 1] (inputs ``tokens[:, :-1]``, targets
    ``tokens[:, 1:]``); global_batch must be divisible by mesh data x microbatches. A host array is
    placed split over "data".
    metrics: float32 scalars ``loss`` (mean next-token cross-entropy of the batch, before the
    update), ``grad_norm`` (before clipping), ``lr`` (the rate this step applied) and ``skipped``
    (bool: the gradients were not finite on some rank, and the update was skipped on every rank);
    with `fidelity_every` = k > 0, on steps divisible by k, ``grad_rel_err`` and ``grad_cos`` of
    the compressed gradient reduction against an exact one (`jaxhc.parallel.fidelity`; NaN on
    other steps and when k = 0). With `overlap`, where `jaxhc.parallel.grads.overlaps` says the
    step can, each layer's gradients are reduced in the backward as soon as they are produced (the
    same bits).
    policy: a `jaxhc.Policy`, a preset name or YAML path, or None for plain `jax.lax` collectives.
    Traffic is recorded by jaxhc's collectives in any active `jaxhc.accounting.Ledger`.

    On XLA:CPU with many host devices, bound the steps in flight (e.g. block on every step's
    metrics): dozens of queued executions with collectives trip XLA's rendezvous timeout.
    """
    check_mesh(mesh, mesh_cfg)
    policy = context.as_policy(policy)
    plan = Plan(model_cfg, mesh_cfg, optim_cfg, policy)
    per_shard = per_shard_train_step(
        model_cfg, mesh_cfg, optim_cfg, policy, fidelity_every, overlap
    )
    specs = plan.state_specs
    # With a nested data axis the program runs on a view of the mesh whose data axis is the
    # sub-axes: the same devices in the same order, so its shardings are equivalent to the
    # state's on `mesh` (jax takes either; a program holds shardings of one mesh only).
    view, data = plan.shard.view(mesh), plan.shard.data_axis
    view_specs = plan.shard.on_view(specs)
    sharded = _map(per_shard, view, (view_specs, P(data)), (view_specs, METRIC_SPECS))

    @functools.partial(
        jax.jit,
        in_shardings=(shardings(view, view_specs), NamedSharding(view, P(data))),
        out_shardings=(shardings(view, view_specs), shardings(view, METRIC_SPECS)),
        donate_argnums=0,
    )
    def step(state, tokens):
        plan.check_state(state)
        plan.check_tokens(tokens.shape, model_cfg.block_size + 1)
        return sharded(state, tokens.astype(jnp.int32))

    return step


def make_eval_loss(model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, policy):
    """``eval_loss(params, tokens) -> loss``, jitted: the train step's loss without an update.

    params: ``state.params``; tokens as for the train step.
    """
    check_mesh(mesh, mesh_cfg)
    plan = Plan(model_cfg, mesh_cfg, policy=policy)
    if plan.sharded_params:  # the parameter group's sub-axes: the view's
        view, data = plan.shard.view(mesh), plan.shard.data_axis
        specs = plan.shard.on_view(plan.state_param_specs)
    else:
        view, data, specs = mesh, "data", plan.param_specs
    per_shard = per_shard_eval_loss(model_cfg, mesh_cfg, policy, data)
    sharded = _map(per_shard, view, (specs, P(data)), P())

    @functools.partial(
        jax.jit,
        in_shardings=(shardings(view, specs), NamedSharding(view, P(data))),
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
    check_mesh(mesh, mesh_cfg)
    plan = Plan(model_cfg, mesh_cfg, policy=policy)  # the train step's flat layout

    def per_shard(params, tokens):
        loss, grads = shard_grads.loss_and_grads(params, tokens, model_cfg, mesh_cfg)
        chunk = zero.reduce_gradients(grads, plan.layout)
        if mesh_cfg.data > 1:
            chunk = jaxhc.all_gather(chunk, "data", tiled=True, kind="grad")
        return loss, plan.layout.unflatten(chunk)

    specs = (P(), plan.param_specs)
    per_shard = _under(context.as_policy(policy), per_shard)
    sharded = _map(per_shard, mesh, (plan.param_specs, P("data")), specs)

    @functools.partial(
        jax.jit,
        in_shardings=(shardings(mesh, plan.param_specs), NamedSharding(mesh, P("data"))),
        out_shardings=shardings(mesh, specs),
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
    check_mesh(mesh, mesh_cfg)
    plan = Plan(model_cfg, mesh_cfg)

    def per_shard(params, inputs):
        def last_stage(hidden):
            return gpt.head(params, hidden, model_cfg).reshape(*inputs.shape, -1)

        return shard_grads.forward(params, inputs, model_cfg, mesh_cfg, last_stage)[None]

    per_shard = _under(context.as_policy(policy), per_shard)
    sharded = _map(per_shard, mesh, (plan.param_specs, P("data")), P("pipe", "data"))

    @functools.partial(
        jax.jit,
        in_shardings=(shardings(mesh, plan.param_specs), NamedSharding(mesh, P("data"))),
    )
    def logits(params, inputs):
        if inputs.ndim != 2 or inputs.shape[1] > model_cfg.block_size:
            raise ValueError(f"inputs have shape {inputs.shape}; expected (batch, <= block_size)")
        validate(model_cfg, mesh_cfg, batch_size=inputs.shape[0])
        return sharded(params, inputs.astype(jnp.int32))[-1]

    return logits
