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
  the first and the last stage (``kind="grad"``; see `_sum_shared`);
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
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import context
from jaxhc._compat import axis_tuple
from jaxhc.collectives import started
from jaxhc.model import gpt
from jaxhc.model.config import GPTConfig, MeshConfig, OptimConfig, validate
from jaxhc.model.tensor_parallel import TensorParallel
from jaxhc.parallel import fidelity, prefetch, zero
from jaxhc.parallel.layout import ALIGN, PAIRED
from jaxhc.parallel.pipeline import gpipe
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
# Per-shard model: embedding on the first stage, blocks through the pipeline, head on the last.


def _forward(params, inputs, cfg: GPTConfig, mesh_cfg: MeshConfig, last_stage_fn, fetch=None):
    """Run the pipelined model on this rank's `inputs` (B_local, T) and return
    ``last_stage_fn(hidden)`` on the last stage, zeros elsewhere; hidden is (M, B_local / M, T, C).
    `fetch`: how the blocks get their parameters from ``params["blocks"]`` (`gpt.run_blocks`).
    """
    tp = TensorParallel(mesh_cfg.tensor)
    stage, stages = jaxhc.axis_index("pipe"), jaxhc.axis_size("pipe")
    micro = inputs.reshape(mesh_cfg.microbatches, -1, inputs.shape[-1])
    x = lax.cond(
        stage == 0,
        lambda: gpt.embed(params, micro, cfg),
        lambda: jnp.zeros((*micro.shape, cfg.n_embd), cfg.compute_dtype),
    )
    hidden = gpipe(lambda h: gpt.run_blocks(params["blocks"], h, cfg, tp, fetch), x)
    out = jax.eval_shape(last_stage_fn, hidden)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out)
    return lax.cond(stage == stages - 1, last_stage_fn, lambda _: zeros, hidden)


def _local_loss(params, tokens, cfg, mesh_cfg, data="data", fetch=None):
    """This rank's share of the global mean loss: the sum of its token losses over all tokens.
    `data`: the data axis (a name or the sub-axes of `jaxhc.parallel.amsp`); `fetch`: see
    `_forward`."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    total = tokens.shape[0] * jaxhc.axis_size(data) * targets.shape[1]

    def loss_sum(hidden):
        logits = gpt.head(params, hidden, cfg)
        return gpt.token_losses(logits, targets.reshape(hidden.shape[:-1])).sum() / total

    return _forward(params, inputs, cfg, mesh_cfg, loss_sum, fetch)


def _local_loss_and_grads(params, tokens, cfg, mesh_cfg, data="data"):
    """Global loss (every rank) and this rank's gradients of its own copy of the parameters."""
    objective = functools.partial(_local_loss, cfg=cfg, mesh_cfg=mesh_cfg, data=data)
    local, grads = jax.value_and_grad(objective)(params, tokens)
    return zero.psum_scalar(local, (*axis_tuple(data), "pipe")), grads


def _overlapped_loss_and_grads(params, tokens, cfg, mesh_cfg, plan, codecs):
    """(global loss, this rank's reduced gradient chunk), each layer's gradient reduced over the
    data levels in the backward as soon as it is produced (`zero.layer_reduce`), the shared
    parameters' after it: the chunk `zero.reduce` gives, with the same bits (each call coded as
    the whole vector's would be: `codecs`, from `zero.whole_codecs`).

    Where the transport can start a layer's first reduce-scatter and finish it later
    (`jaxhc.collectives.started`: the MPI transport's progress threads), the backward only
    starts it, and the layers' reductions are finished after the backward, in the order they
    were started, so the earlier layers' backward runs while their bytes move."""
    layout, shard = plan.layout, plan.shard
    shared = {k: v for k, v in params.items() if k != "blocks"}

    def reduce_row(flat, scattered=0):
        return zero.reduce_gradients(flat, layout, shard=shard, scattered=scattered, codecs=codecs)

    steps = zero.levels(shard)
    row = jax.ShapeDtypeStruct((layout.layer_padded,), jnp.float32)
    axis = steps[0][0] if steps else None
    codec = codecs.get((axis, "scatter"))
    start = axis is not None and started.can_start(row, axis, codec=codec, kind="grad")
    begun = {}  # the started calls' description (the same for every layer)

    def start_row(flat):
        begun["call"] = started.psum_scatter_start(flat, axis, codec=codec, kind="grad")
        return begun["call"].handle

    width = 1 if start else layout.layer_padded // shard.grads
    sink = jnp.zeros((layout.layers, width), jnp.float32)

    def objective(shared, sink):
        full = {**shared, "blocks": (params["blocks"], sink)}
        fetch = zero.layer_reduce(layout, start_row if start else reduce_row)
        return _local_loss(full, tokens, cfg, mesh_cfg, shard.data_axis, fetch)

    local, (g, layers) = jax.value_and_grad(objective, argnums=(0, 1))(shared, sink)
    g = reduce_row(layout.shared_flat(_sum_shared(g, shard.axes)))
    if start:  # the last layer's was started first
        call = begun["call"]

        def finish(_, handle):
            return None, reduce_row(started.psum_scatter_done(call.like(handle)), 1)

        layers = lax.scan(finish, None, layers, reverse=True)[1]
    loss = zero.psum_scalar(local, (*axis_tuple(shard.data_axis), "pipe"))
    return loss, layout.join(g, layers)


def overlaps(plan: Plan, fidelity_every: int = 0, codecs=None) -> bool:
    """Whether the train step can reduce the gradients layer by layer in the backward
    (`train.overlap`) with the bits of the whole vector's reduction: parameters not sharded
    (sharded ones are reduced in their gathers' backward), one micro-batch (the reductions would
    otherwise run once per micro-batch), no error-feedback residuals, no fidelity sampling (it
    needs the unreduced gradients), and every lossy codec of the reduction (`codecs`:
    `zero.whole_codecs`) coding a segment's values as the whole vector's (`ALIGN` a multiple of
    its `segment_values`)."""
    cut = all(
        c is None or c.lossless or (c.segment_values and ALIGN % c.segment_values == 0)
        for c in (codecs or {}).values()
    )
    return (
        cut
        and not plan.sharded_params
        and plan.mesh_cfg.microbatches == 1
        and not plan.error_feedback
        and fidelity_every == 0
    )


def _sum_shared(grads, data=("data",)):
    """The gradients of the parameters every stage holds (`jaxhc.parallel.layout.SHARED`),
    summed among the stages that need them: those the last stage reads (``ln_f``, the head:
    ``wte`` when tied, else ``lm_head``; their canonical copies are the first stage's) over the
    pair of end stages, in one message each way; the first stage's alone (``wpe``, an untied
    ``wte``) only where `_paired` says. The other stages' copies keep their own (zero)
    gradients: stale copies that nothing reads."""
    stages = jaxhc.axis_size("pipe")
    if stages == 1:
        return grads
    paired = {k: grads[k] for k in _paired(grads, data)}
    return {**grads, **jaxhc.psum_pair(paired, "pipe", (0, stages - 1), kind="grad")}


def _paired(grads, data) -> tuple[str, ...]:
    """The shared parameters of `grads` the last stage reads (`PAIRED` but an untied ``wte``),
    and all of them when a lossy codec reduces the gradients over a `data` (sub-)axis: its
    blocks may span neighbouring parameters of the flat ZeRO vector (``wpe`` lies between
    ``ln_f`` and ``wte``), so the end stages' reductions give the paired parameters the same bits
    only if their other shared gradients are the same too."""
    first_only = ("wpe", "wte") if "lm_head" in grads else ("wpe",)
    policy = context.policy()
    for axis in axis_tuple(data) if policy is not None else ():
        codec = policy.codec_for(axis, "grad", jnp.float32)
        if jaxhc.axis_size(axis) > 1 and codec is not None and not codec.lossless:
            first_only = ()
    return tuple(k for k in (*PAIRED, "wpe") if k in grads and k not in first_only)


def _loss_and_grads(params, tokens, cfg, mesh_cfg):
    """Global loss (every rank) and this rank's gradients, not yet summed over "data"."""
    loss, grads = _local_loss_and_grads(params, tokens, cfg, mesh_cfg)
    return loss, _sum_shared(grads)


def _sharded_loss_and_grads(chunk, opt_state, tokens, cfg, mesh_cfg, plan, overlap=False):
    """Sharded parameters (s_p > 1): (global loss, this rank's reduced gradient chunk, opt_state)
    from its parameter chunk. The parameters are gathered over the parameter group, whose
    reverse mode reduce-scatters the gradients over the same levels; `zero.reduce` does the
    levels outside. Error-feedback residuals of the parameter levels ride along as the gathers'
    inputs (their cotangent: the new residuals).

    ``mesh.shard.gather: whole``: the whole chunk at once (`zero.gather_params`). ``layer``:
    the shared parameters so, and each layer's part of the chunk inside the layer scan, forward
    and again backward (`zero.layer_fetch`; with `overlap`, started a layer ahead where the
    transport can: `jaxhc.parallel.prefetch`); the layers' gradients are reduce-scattered one
    layer at a time (`zero.scatter_layers`)."""
    shard, layout = plan.shard, plan.layout
    sum_shared = functools.partial(_sum_shared, data=shard.axes)
    scattered = len(shard.param_axes)
    residual = opt_state.get("residual")
    mine = () if residual is None else tuple(zero.split_residual(residual, layout.padded, shard))
    mine = mine[:scattered]
    data = shard.data_axis

    if not shard.per_layer:
        gather = zero.gather_params(
            layout.unflatten, lambda ct: layout.flatten(sum_shared(ct)), shard
        )

        def objective(chunk, residuals):
            return _local_loss(gather(chunk, residuals), tokens, cfg, mesh_cfg, data)

        local, (g, done) = jax.value_and_grad(objective, argnums=(0, 1))(chunk, mine)
    else:
        gather = zero.gather_params(
            layout.shared_tree, lambda ct: layout.shared_flat(sum_shared(ct)), shard
        )
        fetch = prefetch.layer_fetch(layout, shard, overlap)
        shared, pieces = layout.split(chunk)
        parts = [layout.split(r) for r in mine]  # per level: (shared part, layers' parts)
        sink = jnp.zeros((layout.layers, layout.layer_values), jnp.float32)

        def objective(shared, sink, residuals):
            params = {**gather(shared, residuals), "blocks": (pieces, sink)}
            return _local_loss(params, tokens, cfg, mesh_cfg, data, fetch)

        res = tuple(p[0] for p in parts)
        local, (g, layers, done) = jax.value_and_grad(objective, argnums=(0, 1, 2))(
            shared, sink, res
        )
        layers = layout.pad_layers(layers)
        steps = zero.levels(shard)[:scattered]
        if mine:
            layers, new = zero.scatter_layers(layers, steps, [p[1] for p in parts])
            done = tuple(layout.join(s, n) for s, n in zip(done, new, strict=True))
        else:
            layers = zero.scatter_layers(layers, steps)
        g = layout.join(g, layers)
    loss = zero.psum_scalar(local, (*shard.axes, "pipe"))
    g, opt_state = zero.reduce(g, opt_state, layout, shard, scattered, done)
    return loss, g, opt_state


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
            exact = zero.reduce_gradients(_sum_shared(local_grads), layout, shard=shard)
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
            loss, g, opt_state = _sharded_loss_and_grads(
                params, before, tokens, model_cfg, mesh_cfg, plan, overlap
            )
            local = None
        elif overlap and overlaps(plan, fidelity_every, codecs := zero.whole_codecs(layout, shard)):
            loss, g = _overlapped_loss_and_grads(params, tokens, model_cfg, mesh_cfg, plan, codecs)
            opt_state, local = before, None
        else:
            loss, local = _local_loss_and_grads(
                params, tokens, model_cfg, mesh_cfg, shard.data_axis
            )
            g, opt_state = zero.reduce(_sum_shared(local, shard.axes), before, layout, shard)
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
    plan = Plan(model_cfg, mesh_cfg)

    def eval_loss(params, tokens):
        if plan.sharded_params:  # this rank's chunk, gathered over the parameter group
            params = plan.layout.unflatten(zero.gather_chunk(params[0, 0], plan.shard))
        local = _local_loss(params, tokens, model_cfg, mesh_cfg, data)
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
    other steps and when k = 0). With `overlap`, where `overlaps` says the step can, each layer's
    gradients are reduced in the backward as soon as they are produced (the same bits).
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
        plan.check_tokens(tokens.shape, model_cfg.block_size + 1)
        return sharded(state, tokens.astype(jnp.int32))

    return step


def make_eval_loss(model_cfg: GPTConfig, mesh_cfg: MeshConfig, mesh: Mesh, policy):
    """``eval_loss(params, tokens) -> loss``, jitted: the train step's loss without an update.

    params: ``state.params``; tokens as for the train step.
    """
    check_mesh(mesh, mesh_cfg)
    plan = Plan(model_cfg, mesh_cfg)
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
    plan = Plan(model_cfg, mesh_cfg)

    def per_shard(params, tokens):
        loss, grads = _loss_and_grads(params, tokens, model_cfg, mesh_cfg)
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

        return _forward(params, inputs, model_cfg, mesh_cfg, last_stage)[None]

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
