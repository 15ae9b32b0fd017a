"""The workflow around training: prepare data, generate text, evaluate.

`jaxhc.data.prepare.prepare` (``jaxhc data prepare``), `generate_text` (``jaxhc generate``) and
`evaluate` (``jaxhc eval``); `Run` reads a run directory back. The command-line parsing of these
commands is `jaxhc.workflow.commands`.
"""

from jaxhc.workflow.evaluate import evaluate as evaluate
from jaxhc.workflow.generate import generate_text as generate_text
from jaxhc.workflow.run import Run as Run

__all__ = ["Run", "evaluate", "generate_text"]
