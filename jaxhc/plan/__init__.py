"""Plans for training a model on a cluster: memory and communication models, and a search.

`memory` and `traffic` count, exactly, what jaxhc's compiled train step holds and moves under a
``mesh.shard`` plan (checked against XLA and the ledger); `shapes` gives the planner a model's
shapes (GPT-2, LLaMA); `cluster` reads cluster files (`jaxhc profile` writes one); `layout` is a
plan; `steps` is the rule of a step's data-axis collectives that `traffic` and `cost` share;
`cost` predicts its memory per device and its collectives, `comm` their time, `steptime`
the step's compute and the communication it hides; `search` ranks the plans (``jaxhc plan``);
`planfile` writes the best as a `Plan` that `apply` gives a run's config (``jaxhc train --plan``).

>>> sorted(jaxhc.plan.MODELS)                 # GPT-2 presets; LLaMA shapes: load_shape
['gpt2-large', 'gpt2-medium', 'gpt2-small', 'gpt2-xl']
"""

from jaxhc.plan.cluster import Cluster as Cluster
from jaxhc.plan.cost import collectives as collectives
from jaxhc.plan.layout import Layout as Layout
from jaxhc.plan.memory import StateBytes as StateBytes
from jaxhc.plan.memory import amsp_bytes as amsp_bytes
from jaxhc.plan.memory import flat_bytes as flat_bytes
from jaxhc.plan.memory import state_bytes as state_bytes
from jaxhc.plan.planfile import Plan as Plan
from jaxhc.plan.planfile import apply as apply
from jaxhc.plan.presets import MODELS as MODELS
from jaxhc.plan.presets import load_model as load_model
from jaxhc.plan.presets import load_shape as load_shape
from jaxhc.plan.search import Candidate as Candidate
from jaxhc.plan.search import search as search
from jaxhc.plan.search import table as table
from jaxhc.plan.steps import DataStep as DataStep
from jaxhc.plan.steps import data_steps as data_steps
from jaxhc.plan.traffic import Collective as Collective
from jaxhc.plan.traffic import data_collectives as data_collectives

__all__ = [
    "MODELS",
    "Candidate",
    "Cluster",
    "Collective",
    "DataStep",
    "Layout",
    "Plan",
    "StateBytes",
    "amsp_bytes",
    "apply",
    "collectives",
    "data_collectives",
    "data_steps",
    "flat_bytes",
    "load_model",
    "load_shape",
    "search",
    "state_bytes",
    "table",
]
