"""Plans for training a model on a cluster: memory and communication models, and a search.

`memory` counts the per-device bytes of parameters, gradients and optimizer state under a
sharding plan (``mesh.shard``, `jaxhc.parallel.amsp`); `traffic` the data-axis collectives of a
step and their time over a cluster's links; `search` ranks the valid plans (``jaxhc plan``).
"""

from jaxhc.plan.memory import StateBytes as StateBytes
from jaxhc.plan.memory import amsp_bytes as amsp_bytes
from jaxhc.plan.memory import state_bytes as state_bytes
from jaxhc.plan.presets import MODELS as MODELS
from jaxhc.plan.presets import load_model as load_model
from jaxhc.plan.search import Candidate as Candidate
from jaxhc.plan.search import candidates as candidates
from jaxhc.plan.search import table as table
from jaxhc.plan.traffic import Collective as Collective
from jaxhc.plan.traffic import Links as Links
from jaxhc.plan.traffic import data_collectives as data_collectives
from jaxhc.plan.traffic import step_time as step_time

__all__ = [
    "MODELS",
    "Candidate",
    "Collective",
    "Links",
    "StateBytes",
    "amsp_bytes",
    "candidates",
    "data_collectives",
    "load_model",
    "state_bytes",
    "step_time",
    "table",
]
