"""The train state, where it lives on the mesh, and moving parameters on and off the mesh."""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxhc import context, partition
from jaxhc.model import gpt
from jaxhc.model.config import AXES, GPTConfig, MeshConfig, OptimConfig, validate
from jaxhc.parallel import zero
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layout import SHARED, FlatLayout, param_specs

OPT_SPEC = P("pipe", "tensor", "data")  # AdamW moments: (pipe, tensor, padded flat params)


@flax.struct.dataclass
class TrainState:
    """Everything a step updates: sharded `jax.Array`s on the mesh (or a rank's blocks of them).

    step:      int32 scalar, replicated: the number of updates applied so far.
    params:    the single-layout parameter tree (see `jaxhc.model.gpt`), sharded as in
               `jaxhc.parallel.layout`.
    opt_state: {"adam": optax AdamW state, "master": the exact parameters}; the moments and the
               master copy have shape (pipe, tensor, data x optimizer-state chunk): one chunk per
               device, split over "data"; the chunk is 1/mesh.shard.optim of the padded local
               parameter count, the same on the replicas of an optimizer-state group (ZeRO: one
               group, each device its own 1/data); AdamW's count is a replicated scalar. Under a
               policy with error feedback on "data" also "residual": what the grad codec has not
               yet delivered of each device's flattened gradients, shape (pipe, tensor,
               data x padded local count), one padded vector per device (see
               `jaxhc.psum_scatter` ``residual=``).
    """

    step: jax.Array
    params: dict
    opt_state: Any


class Plan:
    """Shapes, PartitionSpecs and the flat ZeRO layout of a model on a mesh configuration."""

    def __init__(self, model_cfg: GPTConfig, mesh_cfg: MeshConfig, optim_cfg=None, policy=None):
        validate(model_cfg, mesh_cfg)
        self.model, self.mesh_cfg, self.optim = model_cfg, mesh_cfg, optim_cfg
        self.param_shapes = gpt.param_shapes(model_cfg)
        self.param_specs = param_specs(self.param_shapes)
        self.layout = flat_layout(self.param_shapes, mesh_cfg, policy)
        self.shard = ShardPlan.of(mesh_cfg)
        self.error_feedback = error_feedback(policy, mesh_cfg)
        self.param_delta = param_delta(policy, mesh_cfg, self.shard)
        # The parameters as the train state holds them: the single-layout tree, or with sharded
        # parameters (s_p > 1) each device's 1/s_p chunk of its flat vector.
        self.param_chunk = self.layout.padded // self.shard.params
        self.sharded_params = self.shard.sharded_params
        self.state_param_specs = OPT_SPEC if self.sharded_params else self.param_specs
        # Their global shapes: the tree, or one (pipe, tensor, data x chunk) float32 array.
        self.state_param_shapes = self.param_shapes
        if self.sharded_params:
            m = mesh_cfg
            shape = (m.pipe, m.tensor, m.data * self.param_chunk)
            self.state_param_shapes = jax.ShapeDtypeStruct(shape, jnp.float32)
        if optim_cfg is not None:
            size = self.layout.padded // self.shard.optim
            chunk = jax.ShapeDtypeStruct((size,), jnp.float32)
            self.opt_local = jax.eval_shape(functools.partial(zero.init_chunk, optim_cfg), chunk)
            if self.error_feedback:  # every level's residual, innermost first, one after another
                n = sum(zero.residual_sizes(self.layout.padded, self.shard))
                flat = jax.ShapeDtypeStruct((n,), jnp.float32)
                self.opt_local = {**self.opt_local, "residual": flat}
            self.opt_specs = jax.tree.map(lambda x: OPT_SPEC if x.ndim else P(), self.opt_local)
            self.state_specs = TrainState(P(), self.state_param_specs, self.opt_specs)

    def param_state(self, params) -> Any:
        """Single-layout parameters (host arrays) as the train state holds them: the tree
        itself, or with sharded parameters the global array (pipe, tensor, data x chunk) of every
        device's flat parameter chunk (float32 numpy)."""
        params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(params))
        if not self.sharded_params:
            return params
        out = np.zeros(self.state_param_shapes.shape, np.float32)
        self._scatter_flat(params, out, self.param_chunk, self.shard.param_chunk)
        return out

    def _scatter_flat(self, params, out: np.ndarray, size: int, chunk_of) -> None:
        """Into `out` (pipe, tensor, data x size): each device's chunk `chunk_of(d)[0]` of `size`
        values of its flat local vector of the single-layout `params` (numpy)."""
        m, layout = self.mesh_cfg, self.layout
        leaves = layout.treedef.flatten_up_to(params)
        specs = layout.treedef.flatten_up_to(self.param_specs)
        for (p, t), coords in _pipe_tensor(m):
            local = [
                x[partition.block_slices(spec, x.shape, coords, _mesh_shape(m))]
                for x, spec in zip(leaves, specs, strict=True)
            ]
            flat = np.asarray(layout.flatten(layout.treedef.unflatten(local)))
            for d in range(m.data):
                i = chunk_of(d)[0] * size
                out[p, t, d * size : (d + 1) * size] = flat[i : i + size]

    def single_params(self, state_params) -> dict:
        """The single-layout parameter tree (numpy) of the train state's parameters (a global
        array or host copy of it; see `param_state`)."""
        params = jax.device_get(state_params)
        if not self.sharded_params:
            return params
        m, layout = self.mesh_cfg, self.layout
        chunks = np.asarray(params)
        out = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), self.param_shapes)
        leaves = layout.treedef.flatten_up_to(out)
        specs = layout.treedef.flatten_up_to(self.param_specs)
        for (p, t), coords in _pipe_tensor(m):
            flat = np.zeros(layout.padded, np.float32)
            for d in range(self.shard.params):  # the first group holds every chunk once
                i = self.shard.param_chunk(d)[0] * self.param_chunk
                flat[i : i + self.param_chunk] = chunks[
                    p, t, d * self.param_chunk : (d + 1) * self.param_chunk
                ]
            local = layout.treedef.flatten_up_to(layout.unflatten(flat))
            for x, spec, v in zip(leaves, specs, local, strict=True):
                box = partition.block_slices(spec, x.shape, coords, _mesh_shape(m))
                # a replicated parameter from its canonical copy (pipe and tensor rank 0): the
                # other stages' copies of a shared one are stale (`jaxhc.parallel.layout`)
                if partition.owns_block(spec, x.ndim, coords, _mesh_shape(m)):
                    x[box] = np.asarray(v)
        return layout.treedef.unflatten(leaves)

    def opt_state(self, params):
        """The initial optimizer state as global host arrays: zero AdamW moments (and zero
        error-feedback residuals), and each device's master copy of its optimizer-state chunk
        taken from the single-layout `params`."""
        m = self.mesh_cfg

        def zeros(s):  # a device's vector of s.shape[0] values, one per data rank
            return np.zeros((m.pipe, m.tensor, m.data * s.shape[0]) if s.ndim else (), s.dtype)

        out = jax.tree.map(zeros, self.opt_local)
        params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(params))
        master = out["master"]
        self._scatter_flat(params, master, master.shape[-1] // m.data, self.shard.optim_chunk)
        return out

    def check_state(self, state: TrainState) -> None:
        """One line where `state`'s flat vectors are not this plan's (e.g. a state built without
        the policy the step runs, whose codecs shape the layout: `tensor_block`)."""
        m, got = self.mesh_cfg, tuple(state.opt_state["master"].shape)
        want = (m.pipe, m.tensor, m.data * (self.layout.padded // self.shard.optim))
        if got != want:
            raise ValueError(
                f"train state: master copy of shape {got}, the step's flat layout needs {want}: "
                "build the state with the step's policy (init_state(..., policy=))"
            )

    def check_tokens(self, shape, width: int) -> None:
        if len(shape) != 2 or shape[1] != width:
            raise ValueError(f"tokens have shape {tuple(shape)}; expected (batch, {width})")
        validate(self.model, self.mesh_cfg, batch_size=shape[0])


def _mesh_shape(m: MeshConfig) -> dict[str, int]:
    return dict(zip(AXES, m.shape, strict=True))


def _pipe_tensor(m: MeshConfig):
    """((pipe, tensor), coordinates of that (pipe, tensor) block's data rank 0) of every block."""
    for p in range(m.pipe):
        for t in range(m.tensor):
            yield (p, t), {"data": 0, "tensor": t, "pipe": p}


def error_feedback(policy, mesh_cfg: MeshConfig) -> bool:
    """Whether the train state carries residuals: the policy asks for error feedback on "data"
    grad traffic and "data" has ranks to send to. Error feedback elsewhere is refused (one line):
    the trainer's other grad reduction (shared embeddings over "pipe") keeps no residual."""
    policy = context.as_policy(policy)
    if policy is None:
        return False
    for axis in ("tensor", "pipe"):
        if policy.error_feedback(axis) and getattr(mesh_cfg, axis) > 1:
            raise ValueError(
                f"policy {policy.name}: axes.{axis}.error_feedback is not supported by the "
                "trainer (only axes.data.error_feedback)"
            )
    return mesh_cfg.data > 1 and policy.error_feedback("data")


def flat_layout(param_shapes, mesh_cfg: MeshConfig, policy=None) -> FlatLayout:
    """The flat ZeRO layout of `param_shapes` on `mesh_cfg` under `policy`, whose data codecs'
    blocks shape it (`tensor_block`, `piece_block`)."""
    return FlatLayout(
        param_shapes,
        mesh_cfg,
        tensor_block(policy, mesh_cfg),
        piece_block(policy, mesh_cfg, ShardPlan.of(mesh_cfg)),
    )


def piece_block(policy, mesh_cfg: MeshConfig, shard: ShardPlan) -> int:
    """The largest block of the lossy codecs the policy may send over the data axis (0 where
    "data" has one rank): each piece of the flat layout is whole blocks of it (`FlatLayout`), so
    a layer's gather or reduce-scatter (``mesh.shard.gather`` layer or keep, ``train.overlap``)
    codes its values as the whole vector's does. A codec that codes a value by its index in the
    whole message (stochastic rounding) cannot be cut so: layer-by-layer gathers refuse it."""
    policy = context.as_policy(policy)
    if policy is None or mesh_cfg.data == 1:
        return 0
    lossy = [c for c in policy.data_codecs() if not c.lossless]
    if shard.per_layer:
        for c in lossy:
            if not c.segment_values:
                raise ValueError(
                    f"policy {policy.name}: codec {c.spec} on data codes a value by its index in "
                    f"the whole message, which mesh.shard.gather={shard.gather} cuts per layer "
                    "(choose one without stochastic rounding)"
                )
    return max((c.segment_values for c in lossy), default=0)


def tensor_block(policy, mesh_cfg: MeshConfig) -> int:
    """The values per block of the largest lossy codec the policy may send over the data axis
    (`jaxhc.Policy.data_codecs`), where "tensor" and "data" have more than one rank (else 0):
    the flat layout keeps the parameters "tensor" splits and those it replicates in blocks of
    their own (`FlatLayout`), so the tensor ranks' copies of a replicated one stay identical."""
    policy = context.as_policy(policy)
    if policy is None or mesh_cfg.tensor == 1 or mesh_cfg.data == 1:
        return 0
    return max((c.block_values for c in policy.data_codecs() if not c.lossless), default=0)


def param_delta(policy, mesh_cfg: MeshConfig, shard: ShardPlan) -> bool:
    """Whether the parameter gathers send changes since the last gathered copy (the policy's
    ``param_delta`` on "data", which has ranks to gather from). The copy is the replicated
    parameter tree, so sharded parameters (s_p > 1), which no rank holds whole, are refused."""
    policy = context.as_policy(policy)
    if policy is None or mesh_cfg.data == 1 or not policy.param_delta("data"):
        return False
    if shard.sharded_params:
        raise ValueError(
            f"policy {policy.name}: axes.data.param_delta needs replicated parameters, not "
            f"mesh.shard.params={shard.params}"
        )
    return True


def make_mesh(mesh_cfg: MeshConfig, devices=None) -> Mesh:
    """A mesh with axes ("data", "tensor", "pipe") over `devices` (default: all of jax's)."""
    devices = list(jax.devices() if devices is None else devices)
    validate(None, mesh_cfg, n_devices=len(devices))
    return Mesh(np.array(devices).reshape(mesh_cfg.shape), AXES)


def check_mesh(mesh: Mesh, mesh_cfg: MeshConfig) -> None:
    validate(None, mesh_cfg, n_devices=mesh.devices.size)
    if tuple(mesh.axis_names) != AXES or tuple(mesh.devices.shape) != mesh_cfg.shape:
        raise ValueError(
            f"mesh axes {dict(mesh.shape)} do not match mesh config "
            f"data={mesh_cfg.data}, tensor={mesh_cfg.tensor}, pipe={mesh_cfg.pipe}"
        )


def shardings(mesh: Mesh, specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def train_state_specs(
    model_cfg: GPTConfig, mesh_cfg: MeshConfig, optim_cfg: OptimConfig, policy=None
):
    """The PartitionSpecs of a TrainState (a TrainState of specs), e.g. for a launcher's `put`."""
    return Plan(model_cfg, mesh_cfg, optim_cfg, policy).state_specs


# One compiled initializer per model config, run on the default device: every mesh gets the very
# same values, then they are split over the mesh. It runs once a run, so LLVM optimizes it at level
# 1: its random number generation (integer hashing, then elementwise float math) compiles in about
# half the time, to the same bits as at the default level (checked for GPT-2 and LLaMA shapes,
# float32 and bfloat16; tests/test_model_parallel.py compares the trainer's initial parameters
# with a `jax.jit(gpt.init_params)` of default options bit for bit). Level 0 changes bits: it
# fuses no multiply-add.
_init_params = jax.jit(
    gpt.init_params, static_argnums=0, compiler_options={"xla_backend_optimization_level": 1}
)


def initial_state(
    model_cfg: GPTConfig,
    mesh_cfg: MeshConfig,
    optim_cfg: OptimConfig,
    seed: int,
    params=None,
    policy=None,
) -> TrainState:
    """The fresh TrainState of `init_state` as global host (numpy) arrays, to place with
    `train_state_specs` where the mesh is not a `jax.sharding.Mesh` (one process per device)."""
    plan = Plan(model_cfg, mesh_cfg, optim_cfg, policy)
    params = _init_params(model_cfg, seed) if params is None else params
    return TrainState(np.zeros((), np.int32), plan.param_state(params), plan.opt_state(params))


def init_state(
    model_cfg: GPTConfig,
    mesh_cfg: MeshConfig,
    optim_cfg: OptimConfig,
    mesh: Mesh,
    seed: int,
    params=None,
    policy=None,
) -> TrainState:
    """A fresh TrainState placed on `mesh`: parameters from `seed` (or the given single-layout
    `params`, e.g. from `from_hf_gpt2`), zero AdamW moments (and zero error-feedback residuals if
    `policy` asks for them), step 0. Give the policy the steps will run: it also shapes the flat
    ZeRO vectors (`tensor_block`).

    The parameters depend on the seed only, not on the mesh: the same seed gives the same model on
    every mesh, so runs on different meshes are comparable.
    """
    check_mesh(mesh, mesh_cfg)
    plan = Plan(model_cfg, mesh_cfg, optim_cfg, policy)
    params = _init_params(model_cfg, seed) if params is None else params
    opt_state = jax.device_put(plan.opt_state(params), shardings(mesh, plan.opt_specs))
    if plan.sharded_params:
        params = jax.device_put(plan.param_state(params), NamedSharding(mesh, OPT_SPEC))
    else:
        params = from_single(params, mesh)
    step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, P()))
    return TrainState(step, params, opt_state)


def from_single(params, mesh: Mesh) -> dict:
    """Place a single-layout parameter tree (host or device arrays) on `mesh`, sharded."""
    specs = param_specs(params)
    return jax.tree.map(
        lambda x, s: jax.device_put(jnp.asarray(x, jnp.float32), NamedSharding(mesh, s)),
        params,
        specs,
    )


# The axes over which a shared parameter's copies are bit-identical (`_first_stage_copy`).
_REPLICAS = {"data": 0, "tensor": 0}


def _first_stage_copy(x):
    """A parameter every stage holds, from its canonical copy (`jaxhc.partition.owns_block`: the
    first pipeline stage's; another stage's may be stale, see `jaxhc.parallel.layout`): a host
    array as it is. The data and tensor ranks' copies of a stage are identical, so any device of
    the first stage stands for its rank 0, and any process holding one answers, as multi-process
    runs need."""
    if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding):
        return jax.device_get(x)
    mesh = x.sharding.mesh
    shape = dict(mesh.shape)
    for shard in x.addressable_shards:
        where = np.argwhere(mesh.devices == shard.device)[0]
        coords = {a: int(c) for a, c in zip(mesh.axis_names, where, strict=True)}
        if partition.owns_block(x.sharding.spec, x.ndim, {**coords, **_REPLICAS}, shape):
            return np.asarray(shard.data)
    raise ValueError("params_to_single: no device of the first pipeline stage is in this process")


def params_to_single(state_or_params, model_cfg=None, mesh_cfg=None, policy=None) -> dict:
    """The parameters of a TrainState (or a sharded parameter tree) as host numpy arrays.

    With sharded parameters (``mesh.shard.params`` > 1: flat chunks) give the configs too, and
    the policy the state was built for (its flat layout: `tensor_block`)."""
    params = state_or_params.params if isinstance(state_or_params, TrainState) else state_or_params
    if isinstance(params, dict):  # a shared parameter from its canonical copy
        fetch = {k: _first_stage_copy if k in SHARED else jax.device_get for k in params}
        return {k: jax.tree.map(fetch[k], v) for k, v in params.items()}
    if model_cfg is None or mesh_cfg is None:
        raise ValueError(
            "params_to_single: sharded parameters (flat chunks) need model_cfg, mesh_cfg"
        )
    return Plan(model_cfg, mesh_cfg, policy=policy).single_params(params)
